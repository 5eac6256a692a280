/* Status codes and the caller-owned error buffer used by every ABI call. */
#ifndef BACKHAUL_STATUS_H
#define BACKHAUL_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t backhaul_status_t;

enum {
  /* Success. */
  BACKHAUL_OK = 0,
  /* Transient failure (5xx, network, timeout): the same call may succeed later. */
  BACKHAUL_RETRYABLE = 1,
  /* The provider's rate limit is exhausted: wait error->retry_after_ms, then call again. This is
   * not a failed attempt. */
  BACKHAUL_RATE_LIMITED = 2,
  /* The access token was rejected: refresh it once and call again. */
  BACKHAUL_AUTH_EXPIRED = 3,
  /* Permanent failure (404, 410, 422, a missing permission): retrying cannot help. */
  BACKHAUL_FATAL = 4,
  /* The caller passed something invalid (bad config, unknown entity type, corrupt cursor). */
  BACKHAUL_INVALID_ARGUMENT = 5
};

#define BACKHAUL_ERROR_MESSAGE_CAPACITY 1024

/* Filled by the callee when a call does not return BACKHAUL_OK. Owned by the caller (usually on
 * its stack); nothing in it is ever freed across the boundary.
 *   message         NUL-terminated, truncated to fit; never contains the access token.
 *   retry_after_ms  for BACKHAUL_RATE_LIMITED (and optionally BACKHAUL_RETRYABLE): how long to
 *                   wait before calling again; 0 when unknown. The host waits at most a day. */
typedef struct backhaul_error {
  char message[BACKHAUL_ERROR_MESSAGE_CAPACITY];
  int64_t retry_after_ms;
} backhaul_error_t;

/* A string that is not necessarily NUL-terminated. data == NULL means "absent" (different from
 * an empty string, whose data is non-NULL and size 0). */
typedef struct backhaul_string {
  const char* data;
  size_t size;
} backhaul_string_t;

#ifdef __cplusplus
}
#endif

#endif /* BACKHAUL_STATUS_H */
