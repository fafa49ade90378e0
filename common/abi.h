/* abi.h - how the library reads the extensible structs callers pass in
 * (embps.h, "Structs and the ABI"): a caller's struct of another size is
 * read into the library's own, so the code behind sees one layout. */
#ifndef EMBPS_ABI_H
#define EMBPS_ABI_H
#include <stddef.h>

#include "embps/embps.h"

/* The largest `size` an extensible struct may claim: no struct of the API
 * will grow past it, and a garbage size is refused before it is used to
 * read the caller's memory. */
#define EMBPS_STRUCT_SIZE_MAX 4096

/* Reads the caller's struct at src, which begins with a size_t size, into
 * dst (the library's struct of dst_size bytes): the bytes src's size
 * covers are copied, the rest of dst is zero (the defaults), and dst's size
 * is set to dst_size. A src larger than dst must hold zeros past dst_size
 * (fields this library does not know, left unset). Returns 0, or
 * EMBPS_EINVAL with a message in why naming `type` and `init` (the call
 * that sets size) for a size below sizeof(size_t) or above
 * EMBPS_STRUCT_SIZE_MAX, or unknown bytes that are not zero; dst is then
 * unchanged. */
int embps_struct_read(void *dst, size_t dst_size, const void *src,
                      const char *type, const char *init, char *why,
                      size_t why_len);

/* embps_struct_read of an embps_table_alter_t, which also refuses
 * (EMBPS_EINVAL) a bit of `set` whose field lies past the caller's size. */
int embps_table_alter_read(const embps_table_alter_t *in,
                           embps_table_alter_t *out, char *why,
                           size_t why_len);
#endif
