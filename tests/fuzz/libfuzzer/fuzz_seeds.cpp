// Writes the fuzz targets' seed inputs: fuzz_seeds DIR → DIR/<target>/…
#include <cstdio>
#include <exception>

#include "tests/fuzz/fuzz_targets.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  try {
    tokenfab::fuzz::write_seeds(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
