// Stands in for Gloo's header of this name (README.md beside gloo/): names held only
// through smart pointers.
#pragma once

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
