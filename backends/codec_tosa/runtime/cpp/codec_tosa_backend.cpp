// ExecuTorch runtime backend "CodecTosaBackend": executes a delegate whose
// processed payload is a TOSA 1.0 flatbuffer on the TOSA reference model.
//
// Loading this shared library registers the backend (static initialiser below)
// in the registry of the libexecutorch.so it links against, which is the one
// the ExecuTorch Python bindings use.
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/platform/log.h>

#include "tosa_program.h"

namespace codec_tosa {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;

constexpr const char* kBackendId = "CodecTosaBackend";

ScalarType scalar_type_for(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return ScalarType::Float;
    case ElementType::kInt8:
      return ScalarType::Char;
    case ElementType::kInt16:
      return ScalarType::Short;
    case ElementType::kInt32:
      return ScalarType::Int;
    case ElementType::kBool:
      return ScalarType::Bool;
  }
  return ScalarType::Undefined;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

// The TOSA payload is produced for contiguous tensors at the delegate
// boundary, so bytes copy straight through; anything else (another dtype, a
// different shape, a non-default dim order) would be silently misread.
bool check_tensor(
    const char* role, size_t index, const Tensor& tensor,
    const TensorSpec& spec) {
  const ScalarType expected = scalar_type_for(spec.type);
  if (tensor.scalar_type() != expected) {
    ET_LOG(
        Error, "%s: %s %zu ('%s') has dtype %s, the TOSA graph expects %s",
        kBackendId, role, index, spec.name.c_str(),
        executorch::runtime::toString(tensor.scalar_type()),
        element_type_name(spec.type));
    return false;
  }
  bool same_shape = static_cast<size_t>(tensor.dim()) == spec.shape.size();
  for (size_t d = 0; same_shape && d < spec.shape.size(); ++d) {
    same_shape = tensor.size(static_cast<ssize_t>(d)) == spec.shape[d];
  }
  if (!same_shape || tensor.nbytes() != spec.nbytes) {
    std::vector<int64_t> actual;
    for (ssize_t d = 0; d < tensor.dim(); ++d) {
      actual.push_back(tensor.size(d));
    }
    ET_LOG(
        Error,
        "%s: %s %zu ('%s') has shape %s (%zu bytes), the TOSA graph expects "
        "%s (%zu bytes)",
        kBackendId, role, index, spec.name.c_str(),
        shape_string(actual).c_str(), tensor.nbytes(),
        shape_string(spec.shape).c_str(), spec.nbytes);
    return false;
  }
  const auto dim_order = tensor.dim_order();
  for (size_t d = 0; d < dim_order.size(); ++d) {
    if (static_cast<size_t>(dim_order[d]) != d) {
      ET_LOG(
          Error, "%s: %s %zu ('%s') is not in contiguous dim order",
          kBackendId, role, index, spec.name.c_str());
      return false;
    }
  }
  return true;
}

class CodecTosaBackend final : public BackendInterface {
 public:
  bool is_available() const override {
    return true;
  }

  Result<DelegateHandle*> init(
      BackendInitContext& /*context*/,
      FreeableBuffer* processed,
      ArrayRef<CompileSpec> /*compile_specs*/) const override {
    // Compile specs carry provenance only; execution needs just the payload.
    std::string error;
    std::unique_ptr<TosaProgram> program =
        TosaProgram::parse(processed->data(), processed->size(), &error);
    // TosaProgram keeps its own copy, so the blob can go now.
    processed->Free();
    if (!program) {
      ET_LOG(Error, "%s: cannot load delegate: %s", kBackendId, error.c_str());
      return Error::DelegateInvalidCompatibility;
    }
    return static_cast<DelegateHandle*>(program.release());
  }

  Error execute(
      BackendExecutionContext& /*context*/,
      DelegateHandle* handle,
      Span<EValue*> args) const override {
    if (handle == nullptr) {
      return Error::DelegateInvalidHandle;
    }
    TosaProgram& program = *static_cast<TosaProgram*>(handle);
    const size_t n_in = program.inputs().size();
    const size_t n_out = program.outputs().size();

    // args holds the delegate's inputs then its outputs. Only tensors cross
    // into the TOSA graph; non-tensor arguments (scalars folded into the
    // graph at lowering time) are skipped.
    std::vector<Tensor*> tensors;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] != nullptr && args[i]->isTensor()) {
        tensors.push_back(&args[i]->toTensor());
      }
    }
    if (tensors.size() != n_in + n_out) {
      ET_LOG(
          Error,
          "%s: delegate call has %zu tensor arguments, the TOSA graph has "
          "%zu inputs and %zu outputs",
          kBackendId, tensors.size(), n_in, n_out);
      return Error::InvalidArgument;
    }

    std::vector<const void*> inputs(n_in);
    std::vector<void*> outputs(n_out);
    for (size_t i = 0; i < n_in; ++i) {
      if (!check_tensor("input", i, *tensors[i], program.inputs()[i])) {
        return Error::InvalidArgument;
      }
      inputs[i] = tensors[i]->const_data_ptr();
    }
    for (size_t i = 0; i < n_out; ++i) {
      Tensor& out = *tensors[n_in + i];
      if (!check_tensor("output", i, out, program.outputs()[i])) {
        return Error::InvalidArgument;
      }
      outputs[i] = out.mutable_data_ptr();
    }

    std::string error;
    if (!program.run(inputs, outputs, &error)) {
      ET_LOG(Error, "%s: execution failed: %s", kBackendId, error.c_str());
      return Error::Internal;
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* handle) const override {
    delete static_cast<TosaProgram*>(handle);
  }
};

CodecTosaBackend& backend_instance() {
  static CodecTosaBackend backend;
  return backend;
}

// Registration happens when the library is loaded (ctypes.CDLL). A failure
// (e.g. the id is already registered because a second build of this library
// was loaded into the same process) is logged; it cannot be returned.
const bool kRegistered = [] {
  const Error status =
      executorch::runtime::register_backend(Backend{kBackendId, &backend_instance()});
  if (status != Error::Ok) {
    ET_LOG(
        Error, "%s: register_backend failed with error 0x%x", kBackendId,
        static_cast<unsigned>(status));
    return false;
  }
  return true;
}();

}  // namespace
}  // namespace codec_tosa

// A C entry point so that Python can confirm, after ctypes.CDLL, that this
// library's static registration ran and succeeded.
extern "C" __attribute__((visibility("default"))) int
codec_tosa_backend_registered() {
  return codec_tosa::kRegistered ? 1 : 0;
}
