/* A minimal connector in plain C, compiled several times with different definitions to produce
 * the plugins the loader tests need: a good one built against the frozen ABI 1.0 headers, and
 * broken ones (newer major, newer minor, bad magic, failing init, bad metadata, no entry).
 *
 *   VARIANT_ID            plugin id (string literal), default "cplugin"
 *   VARIANT_ABI_MAJOR     overrides the declared ABI major
 *   VARIANT_ABI_MINOR     overrides the declared ABI minor
 *   VARIANT_BAD_MAGIC     declares a wrong magic number
 *   VARIANT_ERROR_SIZE    declares that size of backhaul_error_t in the magic block
 *   VARIANT_INIT_FAILS    init() returns 0 with a message
 *   VARIANT_INIT_LOG      init() appends the id and a newline to the file named by the
 *                         environment variable BACKHAUL_TEST_INIT_LOG
 *   VARIANT_NO_ENTRY      exports a differently named symbol instead of backhaul_entry
 *   VARIANT_ORIGIN_DEP    links libbhtestdep.so (test_plugins/origin_dep.c), found beside the
 *                         plugin through $ORIGIN; init() fails unless its function answers
 *   VARIANT_ORIGIN_MID    the same with libbhtestmid.so (test_plugins/origin_mid.c)
 *   VARIANT_SCHEMA_DEPTH  a config schema of that many objects nested in one another
 *                         ({"a":{"a":...{}...}}), written when the library is loaded
 *   VARIANT_VERSION       plugin version string, default "1.0.0"
 *   VARIANT_HOSTILE_TEXT  a display name, a description and a config schema holding terminal
 *                         controls (an escape sequence, a line forged after a newline, C1 and
 *                         bidi controls)
 *   VARIANT_DEFAULT_TYPE  default entity type, default "item"
 */
#include "backhaul/backhaul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef VARIANT_ID
#define VARIANT_ID "cplugin"
#endif
#ifndef VARIANT_VERSION
#define VARIANT_VERSION "1.0.0"
#endif
#ifndef VARIANT_DEFAULT_TYPE
#define VARIANT_DEFAULT_TYPE "item"
#endif
#ifndef VARIANT_ABI_MAJOR
#define VARIANT_ABI_MAJOR BACKHAUL_ABI_VERSION_MAJOR
#endif
#ifndef VARIANT_ABI_MINOR
#define VARIANT_ABI_MINOR BACKHAUL_ABI_VERSION_MINOR
#endif

static const backhaul_host_t* g_host;

#ifdef VARIANT_ORIGIN_DEP
int backhaul_test_dep_answer(void);
#endif
#ifdef VARIANT_ORIGIN_MID
int backhaul_test_mid_answer(void);
#endif

#ifdef VARIANT_LONG_ID
/* An id of VARIANT_LONG_ID characters ("aaa..."), written when the library is loaded. */
static char g_long_id[VARIANT_LONG_ID + 1];
__attribute__((constructor)) static void fill_long_id(void) {
  memset(g_long_id, 'a', VARIANT_LONG_ID);
  g_long_id[VARIANT_LONG_ID] = '\0';
}
#define DESCRIPTOR_ID g_long_id
#else
#define DESCRIPTOR_ID VARIANT_ID
#endif

#ifdef VARIANT_SCHEMA_DEPTH
static char g_deep_schema[VARIANT_SCHEMA_DEPTH * 6 + 3];
__attribute__((constructor)) static void fill_deep_schema(void) {
  char* at = g_deep_schema;
  for (int i = 0; i < VARIANT_SCHEMA_DEPTH; ++i, at += 5) memcpy(at, "{\"a\":", 5);
  memcpy(at, "{}", 2);
  at += 2;
  memset(at, '}', VARIANT_SCHEMA_DEPTH);
  at[VARIANT_SCHEMA_DEPTH] = '\0';
}
#define DESCRIPTOR_SCHEMA g_deep_schema
#else
#define DESCRIPTOR_SCHEMA "{\"type\":\"object\"}"
#endif

#ifdef VARIANT_HOSTILE_TEXT
#undef DESCRIPTOR_SCHEMA
#define DESCRIPTOR_SCHEMA "{\"type\":\"object\",\"description\":\"\xE2\x80\xAE\\u001b[2J\"}"
#define DESCRIPTOR_NAME "E\033[2K\rid: github"
#define DESCRIPTOR_DESCRIPTION    \
  "fine\nsha256: forged \xC2\x9B" \
  "2J \xE2\x80\xAE"               \
  "desrever"
#else
#define DESCRIPTOR_NAME "C test plugin"
#define DESCRIPTOR_DESCRIPTION "a plugin written in C against the ABI headers"
#endif

static const char* const kTypes[] = {"item"};
static const char* const kDefaults[] = {VARIANT_DEFAULT_TYPE};

static const backhaul_descriptor_t kDescriptor = {sizeof(backhaul_descriptor_t),
                                                  DESCRIPTOR_ID,
                                                  VARIANT_VERSION,
                                                  DESCRIPTOR_NAME,
                                                  DESCRIPTOR_DESCRIPTION,
                                                  kTypes,
                                                  1,
                                                  kDefaults,
                                                  1,
                                                  DESCRIPTOR_SCHEMA};

static void set_message(backhaul_error_t* error, const char* message) {
  strncpy(error->message, message, sizeof(error->message) - 1);
  error->message[sizeof(error->message) - 1] = '\0';
  error->retry_after_ms = 0;
}

static int32_t plugin_init(const backhaul_host_t* host, backhaul_error_t* error) {
#ifdef VARIANT_INIT_FAILS
  (void)host;
  set_message(error, "refusing to start: no licence");
  return 0;
#else
  (void)error;
#ifdef VARIANT_ORIGIN_DEP
  if (backhaul_test_dep_answer() != 42) {
    set_message(error, "libbhtestdep.so gave a wrong answer");
    return 0;
  }
#endif
#ifdef VARIANT_ORIGIN_MID
  if (backhaul_test_mid_answer() != 42) {
    set_message(error, "libbhtestmid.so gave a wrong answer");
    return 0;
  }
#endif
#ifdef VARIANT_INIT_LOG
  const char* log = getenv("BACKHAUL_TEST_INIT_LOG");
  FILE* f = log ? fopen(log, "a") : NULL;
  if (f) {
    fputs(VARIANT_ID "\n", f);
    fclose(f);
  }
#endif
  g_host = host;
  return 1;
#endif
}

static void plugin_deinit(void) { g_host = NULL; }

static backhaul_status_t plugin_validate_config(backhaul_string_t config, backhaul_error_t* error) {
  if (config.size == 0 || config.data[0] != '{') {
    set_message(error, "config must be a JSON object");
    return BACKHAUL_INVALID_ARGUMENT;
  }
  return BACKHAUL_OK;
}

struct backhaul_instance {
  int unused;
};

static backhaul_status_t plugin_create(backhaul_string_t config, backhaul_instance_t** instance,
                                       backhaul_error_t* error) {
  backhaul_status_t status = plugin_validate_config(config, error);
  if (status != BACKHAUL_OK) return status;
  *instance = (backhaul_instance_t*)calloc(1, sizeof(backhaul_instance_t));
  return *instance ? BACKHAUL_OK : BACKHAUL_RETRYABLE;
}

static void plugin_destroy(backhaul_instance_t* instance) { free(instance); }

static backhaul_status_t plugin_validate_scopes(backhaul_instance_t* instance,
                                                const backhaul_unit_t* unit,
                                                backhaul_error_t* error) {
  (void)instance;
  (void)unit;
  (void)error;
  return BACKHAUL_OK;
}

/* One page with one event whose delivery id is "c-<resource id>"; the host's clock value is put
 * in the payload to prove the host services work from C. The cursor picks a contract breach for
 * the host's checks: "null-events" (a count without an event array), "no-delivery-id", and
 * "twin-ids" (two different events under one delivery id). */
typedef struct c_page {
  backhaul_page_t page;
  backhaul_event_t event[2];
  char delivery_id[128];
  char payload[128];
} c_page_t;

static int cursor_is(const backhaul_fetch_request_t* request, const char* text) {
  size_t n = strlen(text);
  return request->cursor.data && request->cursor.size == n &&
         memcmp(request->cursor.data, text, n) == 0;
}

static backhaul_status_t plugin_fetch_page(backhaul_instance_t* instance,
                                           const backhaul_fetch_request_t* request,
                                           backhaul_page_t** out, backhaul_error_t* error) {
  (void)instance;
  c_page_t* p = (c_page_t*)calloc(1, sizeof(c_page_t));
  if (!p) {
    set_message(error, "out of memory");
    return BACKHAUL_RETRYABLE;
  }
  size_t n = request->unit.resource.id.size < 100 ? request->unit.resource.id.size : 100;
  memcpy(p->delivery_id, "c-", 2);
  memcpy(p->delivery_id + 2, request->unit.resource.id.data, n);
  long long now = g_host ? (long long)g_host->now_ms(g_host) : -1;
  /* snprintf is C99. */
  int len = snprintf(p->payload, sizeof(p->payload), "{\"now_ms\":%lld}", now);
  p->event[0].delivery_id.data = p->delivery_id;
  p->event[0].delivery_id.size = strlen(p->delivery_id);
  p->event[0].event_type.data = "item";
  p->event[0].event_type.size = 4;
  p->event[0].payload_json.data = p->payload;
  p->event[0].payload_json.size = (size_t)len;
  p->page.struct_size = sizeof(backhaul_page_t);
  p->page.events = p->event;
  p->page.event_count = 1;
  p->page.raw_count = 1;
  if (cursor_is(request, "null-events")) p->page.events = NULL;
  if (cursor_is(request, "no-delivery-id")) {
    p->event[0].delivery_id.data = NULL;
    p->event[0].delivery_id.size = 0;
  }
  if (cursor_is(request, "twin-ids")) {
    p->event[1] = p->event[0];
    p->event[1].payload_json.data = "{\"other\":true}";
    p->event[1].payload_json.size = 14;
    p->page.event_count = 2;
    p->page.raw_count = 2;
  }
  *out = &p->page;
  return BACKHAUL_OK;
}

static void plugin_release_page(backhaul_instance_t* instance, backhaul_page_t* page) {
  (void)instance;
  free(page); /* page is the first member of c_page_t */
}

#ifdef VARIANT_BAD_MAGIC
#define VARIANT_MAGIC                                                          \
  {                                                                            \
    0xDEADBEEFu, (uint16_t)sizeof(void*), (uint16_t)sizeof(backhaul_string_t), \
        (uint32_t)sizeof(backhaul_error_t), (uint32_t)sizeof(backhaul_event_t) \
  }
#elif defined(VARIANT_ERROR_SIZE)
#define VARIANT_MAGIC                                                                 \
  {                                                                                   \
    BACKHAUL_ABI_MAGIC, (uint16_t)sizeof(void*), (uint16_t)sizeof(backhaul_string_t), \
        (uint32_t)(VARIANT_ERROR_SIZE), (uint32_t)sizeof(backhaul_event_t)            \
  }
#else
#define VARIANT_MAGIC BACKHAUL_MAGIC_INIT
#endif

#ifdef VARIANT_NO_ENTRY
#define VARIANT_SYMBOL backhaul_entry_v2
BACKHAUL_EXPORT extern const backhaul_entry_t backhaul_entry_v2;
#else
#define VARIANT_SYMBOL backhaul_entry
#endif

BACKHAUL_EXPORT const backhaul_entry_t VARIANT_SYMBOL = {
    sizeof(backhaul_entry_t),
    {VARIANT_ABI_MAJOR, VARIANT_ABI_MINOR},
    VARIANT_MAGIC,
    &kDescriptor,
    plugin_init,
    plugin_deinit,
    plugin_validate_config,
    plugin_create,
    plugin_destroy,
    plugin_validate_scopes,
    plugin_fetch_page,
    plugin_release_page,
#if BACKHAUL_ABI_VERSION_MINOR >= 1
    NULL, /* get_extension */
#endif
};
