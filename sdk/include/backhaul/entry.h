/* The one symbol a plugin exports: backhaul_entry. */
#ifndef BACKHAUL_ENTRY_H
#define BACKHAUL_ENTRY_H

#include "backhaul/connector.h"
#include "backhaul/host.h"
#include "backhaul/private/macros.h"
#include "backhaul/status.h"
#include "backhaul/version.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes the host compares before it calls any plugin code (PostgreSQL's Pg_magic_struct idea).
 * These structs never change within a major, so a mismatch means a broken or foreign build. */
typedef struct backhaul_magic {
  uint32_t magic;        /* BACKHAUL_ABI_MAGIC */
  uint16_t pointer_size; /* sizeof(void*) */
  uint16_t string_size;  /* sizeof(backhaul_string_t) */
  uint32_t error_size;   /* sizeof(backhaul_error_t) */
  uint32_t event_size;   /* sizeof(backhaul_event_t) */
} backhaul_magic_t;

#define BACKHAUL_MAGIC_INIT                                                           \
  {                                                                                   \
    BACKHAUL_ABI_MAGIC, (uint16_t)sizeof(void*), (uint16_t)sizeof(backhaul_string_t), \
        (uint32_t)sizeof(backhaul_error_t), (uint32_t)sizeof(backhaul_event_t)        \
  }

/* Lifecycle and threading, per function:
 *   init       [main-thread] once, right after the host checked this struct. If it returns 0 the
 *              host calls nothing else (not even deinit) and unloads the library. `host` stays
 *              valid until deinit() returns.
 *   deinit     [main-thread] once, after every instance was destroyed and every page released.
 *   Everything else may be called from any thread, only between init and deinit. */
typedef struct backhaul_entry {
  uint32_t struct_size; /* sizeof(backhaul_entry_t) as the plugin was built */
  backhaul_version_t abi_version;
  backhaul_magic_t magic;
  const backhaul_descriptor_t* descriptor;

  int32_t (*init)(const backhaul_host_t* host, backhaul_error_t* error);
  void (*deinit)(void);

  /* Checks a config (JSON text) without creating anything: BACKHAUL_OK, or
   * BACKHAUL_INVALID_ARGUMENT with a message naming the field. [thread-safe] */
  backhaul_status_t (*validate_config)(backhaul_string_t config_json, backhaul_error_t* error);

  /* Creates an instance from a config (JSON text, valid for the call only). On success stores it
   * in *instance; on failure leaves *instance NULL and returns a status with a message.
   * [thread-safe] */
  backhaul_status_t (*create)(backhaul_string_t config_json, backhaul_instance_t** instance,
                              backhaul_error_t* error);

  /* Frees an instance. No other call on it may be in flight; its pages must be released first.
   * [thread-safe] for different instances. */
  void (*destroy)(backhaul_instance_t* instance);

  /* Checks that the unit's token can read the unit's resource (BACKHAUL_FATAL when it cannot).
   * [thread-safe]: may run concurrently with any call on the same instance. */
  backhaul_status_t (*validate_scopes)(backhaul_instance_t* instance, const backhaul_unit_t* unit,
                                       backhaul_error_t* error);

  /* Fetches one page. On BACKHAUL_OK stores a page in *page (to be passed to release_page); on
   * any other status leaves *page NULL and fills *error. Performs its HTTP through host->http.
   * [thread-safe]: may run concurrently with any call on the same instance. */
  backhaul_status_t (*fetch_page)(backhaul_instance_t* instance,
                                  const backhaul_fetch_request_t* request, backhaul_page_t** page,
                                  backhaul_error_t* error);

  /* Frees a page returned by fetch_page, on any thread. NULL is ignored. [thread-safe] */
  void (*release_page)(backhaul_instance_t* instance, backhaul_page_t* page);

  /* --- ABI 1.1 --- (the host reads this only when abi_version.minor >= 1) */

  /* Returns a plugin-side extension by versioned id, or NULL. [thread-safe] */
  const void* (*get_extension)(const char* id);
} backhaul_entry_t;

/* Size of the entry of an ABI 1.0 plugin: everything before get_extension. */
#define BACKHAUL_ENTRY_SIZE_V1_0 offsetof(backhaul_entry_t, get_extension)

#define BACKHAUL_ENTRY_SYMBOL "backhaul_entry"

BACKHAUL_EXPORT extern const backhaul_entry_t backhaul_entry;

#ifdef __cplusplus
}
#endif

#endif /* BACKHAUL_ENTRY_H */
