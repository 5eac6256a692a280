// Benchmark subcommands of backhaul-bench.
#pragma once

namespace CLI {
class App;
}

namespace backhaul::bench {

void add_plugin_bench(CLI::App& app);
void add_queue_bench(CLI::App& app);
void add_pipeline_bench(CLI::App& app);

}  // namespace backhaul::bench
