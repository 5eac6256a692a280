/* What a connector is asked (fetch requests) and what it answers (pages of events). */
#ifndef BACKHAUL_CONNECTOR_H
#define BACKHAUL_CONNECTOR_H

#include "backhaul/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Static facts about a connector. Lives as long as the library is loaded. */
typedef struct backhaul_descriptor {
  uint32_t struct_size;
  const char* id;                  /* provider id, [a-z][a-z0-9_-]*, e.g. "github" */
  const char* version;             /* semantic version of the plugin, e.g. "1.2.0" */
  const char* display_name;        /* e.g. "GitHub" */
  const char* description;         /* one sentence */
  const char* const* entity_types; /* every entity type the connector can fetch */
  size_t entity_type_count;
  const char* const* default_entity_types; /* fetched when a run names none; subset of the above */
  size_t default_entity_type_count;
  const char* config_schema_json; /* JSON Schema (an object, nested at most 64 deep) of the
                                     create() config */
} backhaul_descriptor_t;

/* One provider resource (a GitHub repository, a Vercel project).
 * Frozen for this major version: it is embedded by value in backhaul_unit_t, so a field added
 * here would move the unit's fields after it. Fields can only be added at the end of the outer
 * struct (see version.h). */
typedef struct backhaul_resource {
  backhaul_string_t id;   /* provider's stable id, e.g. "515435940" or "prj_abc" */
  backhaul_string_t name; /* provider's name, e.g. "octo-org/hello"; may be absent (data NULL) */
} backhaul_resource_t;

/* Everything a call about one work unit needs. Owned by the host, valid until the call returns.
 * Frozen for this major version: it is embedded by value in backhaul_fetch_request_t, so growing
 * it would move entity_type, since_unix_ms and cursor whatever its own struct_size says (which
 * only describes a unit passed by pointer, to validate_scopes()). Fields can only be added at the
 * end of the outer struct, backhaul_fetch_request_t (see version.h). */
typedef struct backhaul_unit {
  uint32_t struct_size;
  backhaul_string_t installation_id;
  backhaul_resource_t resource;
  backhaul_string_t access_token; /* never log it, never put it in a message */
} backhaul_unit_t;

typedef struct backhaul_fetch_request {
  uint32_t struct_size;
  backhaul_unit_t unit;
  backhaul_string_t entity_type;
  int64_t since_unix_ms;    /* only items updated/created at or after this; 0 = no lower bound */
  backhaul_string_t cursor; /* data == NULL: the first page; else a next_cursor returned earlier */
} backhaul_fetch_request_t;

/* One webhook-shaped event. */
typedef struct backhaul_event {
  backhaul_string_t delivery_id;  /* deterministic, unique per item, contains the resource id */
  backhaul_string_t event_type;   /* e.g. "pull_request", "deployment.succeeded" */
  backhaul_string_t payload_json; /* a JSON object */
} backhaul_event_t;

typedef struct backhaul_rate_limit {
  int64_t remaining;
  int64_t limit;
  int64_t reset_at_unix_ms;
} backhaul_rate_limit_t;

/* A page of results. Allocated by the plugin in fetch_page(); owned by the plugin and valid,
 * unchanged, until the host passes it to release_page(). */
typedef struct backhaul_page {
  uint32_t struct_size;
  const backhaul_event_t* events;
  size_t event_count;
  backhaul_string_t next_cursor; /* data == NULL: this was the last page. Stored by the host in the
                                  * job's checkpoint: one holding the unit's access token fails
                                  * the unit (take the token out of a provider's next link). */
  uint64_t raw_count;     /* items the provider returned, before filtering (>= event_count) */
  int32_t has_rate_limit; /* nonzero: rate_limit holds the provider's last reported limits */
  backhaul_rate_limit_t rate_limit;
} backhaul_page_t;

/* An instance created from a config. Opaque to the host. */
typedef struct backhaul_instance backhaul_instance_t;

#ifdef __cplusplus
}
#endif

#endif /* BACKHAUL_CONNECTOR_H */
