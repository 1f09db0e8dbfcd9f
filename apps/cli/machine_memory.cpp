#include "apps/cli/machine_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace troupe::apps {

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string name, unit;
    double kilobytes = 0;
    if (fields >> name >> kilobytes >> unit && name == "MemAvailable:" && unit == "kB") {
      return kilobytes * 1024;
    }
  }
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace troupe::apps
