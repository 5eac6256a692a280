// backhaul-bench: measures what the issues ask to be measured, printing one JSON line per run.
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/common/logging.h"
#include "host/bench/bench.h"

int main(int argc, char** argv) {
  CLI::App app{"backhaul-bench: benchmark programs (one JSON line per measurement)"};
  app.require_subcommand(1);
  backhaul::bench::add_plugin_bench(app);
  backhaul::bench::add_queue_bench(app);
  backhaul::bench::add_pipeline_bench(app);
  backhaul::logging::configure(backhaul::logging::Format::kText, "critical");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
