/* Backhaul connector ABI: version numbers and the layout magic. */
#ifndef BACKHAUL_VERSION_H
#define BACKHAUL_VERSION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. A host loads plugins of its own major and any minor up to its
 * own; it refuses a different major and a newer minor (the plugin may rely on host behaviour the
 * host does not have). Structs only grow at the end within a major, and only structs the ABI
 * passes by pointer: one embedded by value in another (backhaul_resource_t in backhaul_unit_t,
 * backhaul_unit_t in backhaul_fetch_request_t) is frozen until the next major, since growing it
 * would move the fields of the struct around it. Add such fields at the outer struct's end. */
#define BACKHAUL_ABI_VERSION_MAJOR 1
#define BACKHAUL_ABI_VERSION_MINOR 1

/* History of minors (what a host must not read from an older plugin):
 *   1.0  first stable ABI
 *   1.1  backhaul_entry_t.get_extension (plugin-side extensions by string id) */

typedef struct backhaul_version {
  uint16_t major;
  uint16_t minor;
} backhaul_version_t;

#define BACKHAUL_ABI_VERSION_INIT \
  { BACKHAUL_ABI_VERSION_MAJOR, BACKHAUL_ABI_VERSION_MINOR }

/* "BHL\x01": the first bytes the host checks, so a random exported symbol of the same name is
 * never mistaken for an entry. */
#define BACKHAUL_ABI_MAGIC 0x42484C01u

#ifdef __cplusplus
}
#endif

#endif /* BACKHAUL_VERSION_H */
