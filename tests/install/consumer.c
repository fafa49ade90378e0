/* consumer.c - a program built outside the embps tree against an installed
 * embps (pkg-config or find_package): checks that the installed headers and
 * library are one version with one set of struct sizes, creates TABLE on the
 * server at ADDR, pushes a gradient with a duplicated id (its unique ids
 * found with <embps/nn.h>'s embps_unique) and checks the pulled rows.
 * usage: consumer ADDR TABLE; exits 0 when the rows are exact. */
#include <embps/embps.h>
#include <embps/nn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ADDR TABLE\n", argv[0]);
    return 2;
  }
  if (embps_version() != EMBPS_VERSION_HEX ||
      strcmp(embps_version_string(), EMBPS_VERSION_STRING) ||
      embps_abi_size("embps_table_spec_t") != sizeof(embps_table_spec_t) ||
      embps_abi_size("embps_client_options_t") !=
          sizeof(embps_client_options_t)) {
    fprintf(stderr, "header %s, library %s: they disagree\n",
            EMBPS_VERSION_STRING, embps_version_string());
    return 1;
  }
  embps_client_options_t opts = {
      .size = sizeof opts, .servers = argv[1], .timeout_ms = 10000};
  embps_client_t *c;
  char err[256];
  int rc = embps_client_create(&opts, &c, err, sizeof err);
  if (rc) {
    fprintf(stderr, "connect %s: %s\n", argv[1], err);
    return 1;
  }
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, argv[2], 2, EMBPS_OPT_SGD);
  spec.rows = 100;
  spec.lr = 1.0;
  const int64_t idx[3] = {3, 7, 3};
  const float grad[6] = {1, 2, 0.5f, 0.25f, 2, 4};
  int64_t ids[3];
  uint32_t inverse[3];
  float rows[4] = {0};
  if (embps_unique(idx, 3, ids, inverse) != 2 || ids[0] != 3 || ids[1] != 7) {
    fprintf(stderr, "embps_unique: not {3, 7}\n");
    return 1;
  }
  if ((rc = embps_create_table(c, &spec)) ||
      (rc = embps_push(c, argv[2], idx, 3, grad, 2, 0)) ||
      (rc = embps_pull(c, argv[2], ids, 2, rows, 2))) {
    fprintf(stderr, "%s: %s\n", embps_err_name(rc), embps_client_last_error(c));
    embps_client_destroy(c);
    return 1;
  }
  embps_client_destroy(c);
  /* zeros, one SGD step with lr 1 on the summed gradient */
  const float want[4] = {-3, -6, -0.5f, -0.25f};
  for (int i = 0; i < 4; i++) {
    if (rows[i] != want[i]) {
      fprintf(stderr, "row value %d: %g, want %g\n", i, rows[i], want[i]);
      return 1;
    }
  }
  printf("ok %s\n", argv[2]);
  return 0;
}
