// What dtr's SVG writers (the loss plot, the step timeline) share: XML escaping of text and
// attributes, the "nice" tick step of an axis (1, 2 or 5 x 10^k, Heckbert's rule in Graphics
// Gems). Writers write finished files with write_file_atomically (core/posix_file.h), so
// a reader, a browser reloading the picture mid-run, never sees half a file.
#pragma once

#include <string>
#include <string_view>

namespace dtr::svg {

// `text` with & < > " ' replaced by their entities: safe in element text and in attributes.
std::string xml_escape(std::string_view text);

// The smallest 1, 2 or 5 x 10^k at least range / target: about `target` intervals over
// `range` (> 0). E.g. nice_step(9.2, 6) == 2 and nice_step(0.37, 4) == 0.1.
double nice_step(double range, int target);

}  // namespace dtr::svg
