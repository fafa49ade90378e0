/* abi.c - what a program linked to libembps can ask the library about
 * itself: its version (from the generated embps/version.h) and the size of
 * each public struct (embps_abi_size, for bindings that mirror them); and
 * how it reads the extensible structs callers pass in (abi.h). */
#include "abi.h"

#include <stdio.h>
#include <string.h>

#include "embps/nn.h"
#include "util.h"

unsigned embps_version(void) { return EMBPS_VERSION_HEX; }

const char *embps_version_string(void) { return EMBPS_VERSION_STRING; }

/* Every struct of embps.h and nn.h. */
#define EMBPS_ABI_TYPES_(X)                                                    \
  X(embps_client_options_t)                                                    \
  X(embps_table_spec_t)                                                        \
  X(embps_table_alter_t)                                                       \
  X(embps_table_info_t)                                                        \
  X(embps_server_stats_t)                                                      \
  X(embps_member_primary_t)                                                    \
  X(embps_checkpoint_info_t)                                                   \
  X(embps_scan_chunk_t)                                                        \
  X(embps_slices_t)

size_t embps_abi_size(const char *type_name) {
  if (!type_name)
    return 0;
#define EMBPS_ABI_SIZE_(type)                                                  \
  if (strcmp(type_name, #type) == 0)                                           \
    return sizeof(type);
  EMBPS_ABI_TYPES_(EMBPS_ABI_SIZE_)
#undef EMBPS_ABI_SIZE_
  return 0;
}

/* The fixed-size structs keep their size for good: a new field takes
 * reserved words. (Sizes on LP64; other ABIs have their own.) */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(embps_table_spec_t) == 456, "spec: use reserved words");
_Static_assert(sizeof(embps_table_info_t) == 616, "info: use reserved words");
_Static_assert(sizeof(embps_server_stats_t) == 904,
               "stats: use reserved words");
_Static_assert(sizeof(embps_checkpoint_info_t) == 64,
               "checkpoint info: use reserved words");
_Static_assert(sizeof(embps_scan_chunk_t) == 104,
               "scan chunk: use reserved words");
_Static_assert(sizeof(embps_slices_t) == 56, "slices: use reserved words");
#endif

int embps_struct_read(void *dst, size_t dst_size, const void *src,
                      const char *type, const char *init, char *why,
                      size_t why_len) {
  size_t size;
  memcpy(&size, src, sizeof size);
  if (size < sizeof size || size > EMBPS_STRUCT_SIZE_MAX)
    return embps_refuse(EMBPS_EINVAL, why, why_len, "%s.size is %zu, not a struct size (%zu in "
                  "this library): set it with %s", type, size, dst_size, init);
  const unsigned char *p = src;
  for (size_t i = dst_size; i < size; i++)
    if (p[i])
      return embps_refuse(EMBPS_EINVAL, why, why_len, "%s sets fields libembps %s does not know "
                    "(byte %zu of its %zu is not 0; this library's has %zu)",
                    type, EMBPS_VERSION_STRING, i, size, dst_size);
  size_t n = size < dst_size ? size : dst_size;
  memcpy(dst, src, n);
  memset((unsigned char *)dst + n, 0, dst_size - n);
  memcpy(dst, &dst_size, sizeof dst_size);
  return 0;
}

int embps_table_alter_read(const embps_table_alter_t *in,
                           embps_table_alter_t *out, char *why,
                           size_t why_len) {
  embps_table_alter_t a;
  int rc = embps_struct_read(&a, sizeof a, in, "embps_table_alter_t",
                             "embps_table_alter_init()", why, why_len);
  if (rc)
    return rc;
  size_t size = in->size;
#define EMBPS_ALTER_COVERED_(field, bit)                                       \
  if ((a.set & (bit)) &&                                                       \
      offsetof(embps_table_alter_t, field) + sizeof a.field > size)            \
    return embps_refuse(EMBPS_EINVAL, why, why_len, "embps_table_alter_t sets " #field " but its " \
                  "size (%zu) does not hold that field", size);
  EMBPS_TABLE_ALTER_FIELDS(EMBPS_ALTER_COVERED_)
#undef EMBPS_ALTER_COVERED_
  *out = a;
  return 0;
}
