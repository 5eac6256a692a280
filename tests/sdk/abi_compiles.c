/* The ABI headers compile as strict C (C99 and C11), and C sees the same layout as C++: the sizes
 * and offsets computed here are compared with C++'s in connector_wrapper_test.cpp. */
#include "backhaul/backhaul.h"

#include <stddef.h>

size_t backhaul_c_layout(size_t* out, size_t capacity);

size_t backhaul_c_layout(size_t* out, size_t capacity) {
  const size_t values[] = {
      sizeof(backhaul_string_t),
      sizeof(backhaul_error_t),
      sizeof(backhaul_host_t),
      sizeof(backhaul_http_request_t),
      sizeof(backhaul_http_response_t),
      sizeof(backhaul_descriptor_t),
      sizeof(backhaul_unit_t),
      sizeof(backhaul_fetch_request_t),
      sizeof(backhaul_event_t),
      sizeof(backhaul_page_t),
      sizeof(backhaul_entry_t),
      offsetof(backhaul_entry_t, descriptor),
      offsetof(backhaul_entry_t, get_extension),
      BACKHAUL_ENTRY_SIZE_V1_0,
  };
  size_t n = sizeof(values) / sizeof(values[0]);
  size_t i;
  for (i = 0; i < n && i < capacity; ++i) out[i] = values[i];
  return n;
}
