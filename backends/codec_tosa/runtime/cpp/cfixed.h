// Minimal stand-in for the reference model's `cfixed.h`, which tosa-tools'
// serialization headers include but the wheel does not ship.
//
// The serialization headers only *name* `ct::mxint8` (in type comparisons and
// in declarations of conversion helpers this backend never calls), so a
// declaration is enough; no fixed-point arithmetic is provided. The alias must
// spell the same type the installed libraries were built with,
// `ct::cfixed<true, 2, 6>` (see `nm -C libtosa_serialization_lib.a`), so that
// any mangled name we might form matches theirs.
#ifndef CODEC_TOSA_CFIXED_STANDIN_H
#define CODEC_TOSA_CFIXED_STANDIN_H

#include "cfloat_forward.h"  // declares the class template ct::cfixed

namespace ct {
using mxint8 = cfixed<true, 2, 6>;
}  // namespace ct

#endif  // CODEC_TOSA_CFIXED_STANDIN_H
