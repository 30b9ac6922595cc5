// The `tilemoe` command. Exit status: 0 on success, 1 on bad input or any error, with one line
// on stderr saying what is wrong and where.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tilemoe: routed MoE experts on CPUs (AMX, AVX512-BF16), inference and LoRA fine-tuning"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  int status = 0;
  tilemoe::cli::add_forward_backward_commands(app, status);
  tilemoe::cli::add_convert_lora_command(app, status);
  tilemoe::cli::add_export_peft_command(app, status);
  tilemoe::cli::add_quantize_command(app, status);
  tilemoe::cli::add_demo_command(app, status);
  tilemoe::cli::add_train_demo_command(app, status);
  tilemoe::cli::add_bench_command(app, status);
  tilemoe::cli::add_info_command(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "tilemoe: error: " << e.what() << " (see --help)\n";
    return 1;
  } catch (const tilemoe::Error& e) {
    std::cerr << "tilemoe: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "tilemoe: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tilemoe: error: " << e.what() << "\n";
    return 1;
  }
  return status;
}
