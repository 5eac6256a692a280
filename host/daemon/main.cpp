// backhauld: the host daemon (SPEC F1-F6). See docs/daemon.md.
#include "host/daemon/main.h"

int main(int argc, char** argv) { return backhaul::daemon::main(argc, argv); }
