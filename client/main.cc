// trainyard: the command-line client.

#include <signal.h>

#include <string>
#include <vector>

#include "client/cli.h"

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return trainyard::cli::RunCli(std::vector<std::string>(argv + 1, argv + argc));
}
