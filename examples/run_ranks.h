// The examples' launcher: forks `world` processes that rendezvous over a FileStore in DIR
// (argv[1], default a temp dir) and run `train(rank, world, store)`; returns 0 when all exit 0.
// Under torchrun/SLURM each rank would call train() itself.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

inline int run_ranks(int argc, char** argv, int world, const char* name,
                     const std::function<int(int, int, const c10::intrusive_ptr<c10d::Store>&)>& train) {
  namespace fs = std::filesystem;
  const fs::path dir =
      argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / (std::string(name) + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::remove(dir / "store");
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      auto store = c10::make_intrusive<c10d::FileStore>((dir / "store").string(), world);
      const int rc = train(rank, world, store);
      std::fflush(nullptr);
      std::_Exit(rc);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (argc <= 1) fs::remove_all(dir);
  return failed == 0 ? 0 : 1;
}
