#include "host/cli/cli.h"

int main(int argc, char** argv) { return backhaul::cli::run(argc, argv); }
