/* Services the host hands to a plugin: logging, HTTP performed by the host, a clock. */
#ifndef BACKHAUL_HOST_H
#define BACKHAUL_HOST_H

#include "backhaul/status.h"
#include "backhaul/version.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  BACKHAUL_LOG_DEBUG = 1,
  BACKHAUL_LOG_INFO = 2,
  BACKHAUL_LOG_WARN = 3,
  BACKHAUL_LOG_ERROR = 4
};

typedef struct backhaul_http_header {
  backhaul_string_t name;
  backhaul_string_t value;
} backhaul_http_header_t;

/* A request the plugin asks the host to perform. Everything it points to belongs to the plugin
 * and only needs to stay valid until http() returns. */
typedef struct backhaul_http_request {
  uint32_t struct_size;     /* sizeof(backhaul_http_request_t) as the plugin was built */
  backhaul_string_t method; /* "GET", "POST", ... */
  backhaul_string_t url;    /* absolute http:// or https:// URL */
  const backhaul_http_header_t* headers;
  size_t header_count;
  backhaul_string_t body; /* data == NULL: no body */
  uint32_t timeout_ms;    /* whole-request timeout; 0 = the host's default */
} backhaul_http_request_t;

/* A response the host received. Owned by the host until the plugin passes it to
 * http_release(); valid (and unchanged) until then. Header names are lower case; a header that
 * appeared several times appears several times. Redirects (301, 302, 303, 307, 308) have already
 * been followed by the host (at most 5), so status is never a redirect unless the limit was hit.
 * A redirect to another origin (scheme, host or port) carries only the request's Accept*,
 * Content-*, Cache-Control, Pragma, If-*, Range and User-Agent headers: any other, which may be a
 * credential, stays with the origin it was given for. */
typedef struct backhaul_http_response {
  int32_t status; /* HTTP status code, e.g. 200 */
  const backhaul_http_header_t* headers;
  size_t header_count;
  backhaul_string_t body;
  backhaul_string_t final_url; /* the URL that answered, after redirects */
} backhaul_http_response_t;

/* The host's services. Valid from init() until deinit() returns; the host never changes it. */
typedef struct backhaul_host {
  uint32_t
      struct_size; /* sizeof(backhaul_host_t) as the host was built; read fields only below it */
  backhaul_version_t abi_version; /* the host's ABI version */
  void* host_data;                /* reserved for the host */

  /* Writes one log line attributed to the plugin. The host redacts tokens, but never pass one.
   * [thread-safe] */
  void (*log)(const struct backhaul_host* host, int32_t level, backhaul_string_t message);

  /* Performs one HTTP request. Returns BACKHAUL_OK when any HTTP response arrived (whatever its
   * status code; interpreting it is the plugin's job) and stores it in *response, to be handed
   * back with http_release(). Returns BACKHAUL_RETRYABLE on a connection error or timeout, or
   * BACKHAUL_INVALID_ARGUMENT for a malformed request, with a message in *error and *response
   * left NULL. [thread-safe]: any number of calls may run at once. */
  backhaul_status_t (*http)(const struct backhaul_host* host,
                            const backhaul_http_request_t* request,
                            backhaul_http_response_t** response, backhaul_error_t* error);

  /* Frees a response returned by http(). NULL is ignored. [thread-safe] */
  void (*http_release)(const struct backhaul_host* host, backhaul_http_response_t* response);

  /* Wall-clock time in milliseconds since the Unix epoch (injectable by tests). [thread-safe] */
  int64_t (*now_ms)(const struct backhaul_host* host);

  /* Returns the service registered under a versioned id such as "backhaul.secrets/1", or NULL
   * when the host has none. An incompatible change gets a new "/N" id; old ids keep working.
   * The returned pointer lives as long as the host struct. [thread-safe] */
  const void* (*get_extension)(const struct backhaul_host* host, const char* id);
} backhaul_host_t;

#ifdef __cplusplus
}
#endif

#endif /* BACKHAUL_HOST_H */
