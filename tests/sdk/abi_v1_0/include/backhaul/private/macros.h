/* Export and visibility macros. Not part of the stable contract; may change with the SDK. */
#ifndef BACKHAUL_PRIVATE_MACROS_H
#define BACKHAUL_PRIVATE_MACROS_H

#if defined(_WIN32)
#define BACKHAUL_EXPORT __declspec(dllexport)
#else
#define BACKHAUL_EXPORT __attribute__((visibility("default")))
#endif

#endif /* BACKHAUL_PRIVATE_MACROS_H */
