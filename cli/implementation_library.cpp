#include "implementation_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>

#include "cli.h"
#include "tdc/implementation.h"

namespace tdc::cli {

namespace fs = std::filesystem;

ImplementationDescriptor read_descriptor(const fs::path& lib) {
  std::error_code ec;
  if (!fs::is_regular_file(lib, ec))
    throw UsageError(
        fmt::format("--impl '{}': not a file (an implementation is a shared library; "
                    "docs/plugging-in.md)",
                    lib.string()));
  void* handle = dlopen(fs::absolute(lib).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw UsageError(fmt::format("--impl '{}': cannot be loaded: {}", lib.string(), dlerror()));
  using Describe = const tdc_implementation_descriptor* (*)();
  auto describe = reinterpret_cast<Describe>(dlsym(handle, "tdc_implementation"));
  if (!describe) {
    dlclose(handle);
    throw UsageError(
        fmt::format("--impl '{}': does not export tdc_implementation() (the implementation "
                    "descriptor, tdc/implementation.h; docs/plugging-in.md)",
                    lib.string()));
  }
  const tdc_implementation_descriptor* d = describe();
  if (!d || d->abi_version != TDC_IMPLEMENTATION_ABI || !d->name || !*d->name) {
    int abi = d ? d->abi_version : -1;
    dlclose(handle);
    throw UsageError(
        fmt::format("--impl '{}': tdc_implementation() returned {} (abi_version {}); this tdc "
                    "reads abi_version {} with a non-empty name",
                    lib.string(), d ? "a descriptor" : "null", abi, TDC_IMPLEMENTATION_ABI));
  }
  ImplementationDescriptor out{d->name, d->version ? d->version : "", {}};
  for (const char* const* f = d->features; f && *f; ++f) out.features.emplace_back(*f);
  dlclose(handle);
  return out;
}

ImplementationDescriptor use_implementation(const fs::path& lib, const fs::path& dir) {
  ImplementationDescriptor d = read_descriptor(lib);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path link = dir / "libtdc.so";
  fs::remove(link, ec);
  fs::create_symlink(fs::absolute(lib), link, ec);
  if (ec)
    throw UsageError(fmt::format("--impl: cannot link '{}' to '{}': {}", link.string(), lib.string(), ec.message()));
  const char* old = std::getenv("LD_LIBRARY_PATH");
  std::string path = fs::absolute(dir).string() + (old && *old ? std::string(":") + old : "");
  ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  return d;
}

}  // namespace tdc::cli
