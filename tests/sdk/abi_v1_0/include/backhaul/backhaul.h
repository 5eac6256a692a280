/* Umbrella header of the Backhaul connector C ABI. */
#ifndef BACKHAUL_BACKHAUL_H
#define BACKHAUL_BACKHAUL_H

#include "backhaul/connector.h"
#include "backhaul/entry.h"
#include "backhaul/host.h"
#include "backhaul/status.h"
#include "backhaul/version.h"

#endif /* BACKHAUL_BACKHAUL_H */
