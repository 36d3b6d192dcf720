// The last error of this thread, readable from Python (ttd_last_error) and the host test.
// TensorRT's ILogger changed layout between TensorRT 10 and 11, so the library never calls
// into a logger it is handed: errors go to this string and to stderr.
#pragma once

#include <string>

namespace torchtrt_dist
{

void setLastError(std::string const& message, bool print = true);
std::string const& lastError();
void clearLastError();

} // namespace torchtrt_dist
