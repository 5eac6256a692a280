#include "host/cli/cli.h"
#include "host/common/process.h"

int main(int argc, char** argv) {
  if (!backhaul::host::start_clean()) return 1;
  return backhaul::cli::run(argc, argv);
}
