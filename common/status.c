/* status.c - messages and names for embps error codes and -errno values. */
#include <errno.h>
#include <string.h>

#include "embps/embps.h"

const char *embps_strerror(int code) {
  switch (code) {
  case 0:
    return "ok";
#define EMBPS_MSG_(name, c, msg)                                               \
  case c:                                                                      \
    return msg;
    EMBPS_ERRNO_MAP(EMBPS_MSG_)
#undef EMBPS_MSG_
  default:
    break;
  }
  if (code < 0 && code > -4096)
    return strerror(-code); /* glibc: static strings for known errnos */
  return "unknown error";
}

const char *embps_err_name(int code) {
  switch (code) {
  case 0:
    return "OK";
#define EMBPS_NAME_(name, c, msg)                                              \
  case c:                                                                      \
    return "EMBPS_" #name;
    EMBPS_ERRNO_MAP(EMBPS_NAME_)
#undef EMBPS_NAME_
  case -ENOMEM:
    return "ENOMEM";
  case -ECONNREFUSED:
    return "ECONNREFUSED";
  case -ECONNRESET:
    return "ECONNRESET";
  case -EPIPE:
    return "EPIPE";
  case -ETIMEDOUT:
    return "ETIMEDOUT";
  case -EINVAL:
    return "EINVAL";
  default:
    return "UNKNOWN";
  }
}
