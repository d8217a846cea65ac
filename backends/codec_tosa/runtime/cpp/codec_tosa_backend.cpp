// ExecuTorch runtime backend "CodecTosaBackend": executes a delegate whose
// processed payload is a TOSA 1.0 flatbuffer on the TOSA reference model.
//
// Loading this shared library registers the backend (static initialiser below)
// in the registry of the libexecutorch.so it links against, which is the one
// the ExecuTorch Python bindings use.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/named_data_map.h>
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
using executorch::runtime::NamedDataMap;
using executorch::runtime::Result;
using executorch::runtime::Span;

constexpr const char* kBackendId = "CodecTosaBackend";

ScalarType scalar_type_for(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return ScalarType::Float;
    case ElementType::kFloat16:
      return ScalarType::Half;
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

std::vector<int64_t> sizes_of(const Tensor& tensor) {
  std::vector<int64_t> sizes;
  for (ssize_t d = 0; d < tensor.dim(); ++d) {
    sizes.push_back(tensor.size(d));
  }
  return sizes;
}

// Bytes copy straight through the delegate boundary, so a tensor must hold
// them in the TOSA graph's layout: the same dtype, and either the graph's shape
// in contiguous dim order or, for a tensor in another dim order (a
// channels-last input, which Arm's lowering keeps NHWC), sizes that read in
// that order are the graph's shape. Anything else would be silently misread.
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
  // TOSA has no rank-0 tensor: Arm's lowering gives a scalar the shape [1]
  // (a cond's predicate, a full reduction); the bytes are the same.
  const bool scalar_as_one = tensor.dim() == 0 && spec.shape.size() == 1 && spec.shape[0] == 1;
  same_shape = same_shape || scalar_as_one;
  const auto order = tensor.dim_order();
  bool default_order = true;
  for (size_t d = 0; d < order.size(); ++d) {
    default_order = default_order && static_cast<size_t>(order[d]) == d;
  }
  if (default_order && (!same_shape || tensor.nbytes() != spec.nbytes)) {
    ET_LOG(
        Error,
        "%s: %s %zu ('%s') has shape %s (%zu bytes), the TOSA graph expects "
        "%s (%zu bytes)",
        kBackendId, role, index, spec.name.c_str(),
        shape_string(sizes_of(tensor)).c_str(), tensor.nbytes(),
        shape_string(spec.shape).c_str(), spec.nbytes);
    return false;
  }
  const auto dim_order = tensor.dim_order();
  bool contiguous = true;
  for (size_t d = 0; d < dim_order.size(); ++d) {
    contiguous = contiguous && static_cast<size_t>(dim_order[d]) == d;
  }
  if (same_shape && contiguous) {
    return true;
  }
  bool physical = static_cast<size_t>(tensor.dim()) == spec.shape.size() &&
      tensor.nbytes() == spec.nbytes;
  for (size_t d = 0; physical && d < spec.shape.size(); ++d) {
    physical = tensor.size(static_cast<ssize_t>(dim_order[d])) == spec.shape[d];
  }
  if (physical) {
    return true;  // its memory is the graph's layout
  }
  ET_LOG(
      Error,
      "%s: %s %zu ('%s') has shape %s (%zu bytes) in dim order %s, the TOSA "
      "graph expects %s (%zu bytes)",
      kBackendId, role, index, spec.name.c_str(), shape_string(sizes_of(tensor)).c_str(),
      tensor.nbytes(),
      shape_string(std::vector<int64_t>(dim_order.begin(), dim_order.end())).c_str(),
      shape_string(spec.shape).c_str(), spec.nbytes);
  return false;
}

// FNV-1a 64 of the processed payload, in hex: how a recorded call names its
// delegate. runtime/executorch_runner.py computes the same hash over each
// payload it reads from the .pte and matches the two.
std::string payload_hash(const void* data, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

// Copies the blob stored under `key` into `out`. get_data is the NamedDataMap
// call for opaque blobs (load_data_into needs a tensor layout in a
// FlatTensorDataMap and is not implemented by MergedDataMap, which the runtime
// uses when the .pte holds named data of its own too). Under the Python
// bindings the map reads the .ptd through an MmapDataLoader, so the
// FreeableBuffer is an mmap (mlock'ed, errors ignored) of the blob's pages; it
// is released as soon as it has been copied. The reference model keeps
// constants in std::vector<uint8_t> (TosaSerializationTensor::SetData), so
// this one copy is unavoidable.
bool fetch_named_data(
    const NamedDataMap* map, const std::string& key, size_t expected_size,
    std::vector<uint8_t>* out, std::string* error) {
  if (map == nullptr) {
    *error = "no named data given (load this .pte's .ptd)";
    return false;
  }
  Result<FreeableBuffer> buffer = map->get_data(key);
  if (!buffer.ok()) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%x", static_cast<unsigned>(buffer.error()));
    *error = buffer.error() == Error::NotFound
        ? std::string("not in the named data (load this .pte's .ptd)")
        : std::string("get_data failed with error 0x") + hex;
    return false;
  }
  if (buffer->size() != expected_size) {
    *error = "named data has " + std::to_string(buffer->size()) +
        " bytes, the payload expects " + std::to_string(expected_size);
    return false;
  }
  const auto* bytes = static_cast<const uint8_t*>(buffer->data());
  out->assign(bytes, bytes + buffer->size());
  buffer->Free();  // munmap now, not at scope end
  return true;
}

// What init hands back as the DelegateHandle: the program and the hash that
// names it in recordings.
struct Delegate {
  std::unique_ptr<TosaProgram> program;
  std::string hash;
};

// The opt-in recorder behind codec_tosa_record (docs/DESIGN.md, "Validation"):
// validate runs every delegate on the TOSA reference model with the inputs it
// really received, including values the CPU computed. Off unless a directory
// is set. A mutex guards the state, so concurrent executes get distinct call
// numbers; recording is for validation, not for speed.
//
// For call N (counted from 0 since recording was last enabled) of the
// delegate with payload hash H it writes
//   call-NNNNNN-H-in<i>.bin / -out<i>.bin   raw tensor bytes, block order
// and appends one line per tensor to manifest.tsv:
//   N <tab> H <tab> in|out <tab> i <tab> dtype <tab> d0,d1,... <tab> file
// Outputs are written only after a successful run. A write that fails is
// logged and skipped: recording never fails the run.
class Recorder {
 public:
  void set(const char* dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dir_ = (dir != nullptr) ? dir : "";
    next_call_ = 0;
  }

  // Reserves a call number; -1 when recording is off.
  int64_t begin_call() {
    std::lock_guard<std::mutex> lock(mutex_);
    return dir_.empty() ? -1 : next_call_++;
  }

  void write(
      int64_t call, const std::string& hash, const char* role, size_t index,
      const TensorSpec& spec, const void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dir_.empty()) {
      return;
    }
    char name[96];
    std::snprintf(
        name, sizeof name, "call-%06" PRId64 "-%s-%s%zu.bin", call,
        hash.c_str(), role, index);
    const std::string path = dir_ + "/" + name;
    if (!write_file(path, "wb", data, spec.nbytes)) {
      return;
    }
    std::string dims;
    for (size_t d = 0; d < spec.shape.size(); ++d) {
      dims += (d ? "," : "") + std::to_string(spec.shape[d]);
    }
    const std::string line = std::to_string(call) + "\t" + hash + "\t" + role +
        "\t" + std::to_string(index) + "\t" + element_type_name(spec.type) +
        "\t" + dims + "\t" + name + "\n";
    write_file(dir_ + "/manifest.tsv", "ab", line.data(), line.size());
  }

 private:
  static bool write_file(
      const std::string& path, const char* mode, const void* data,
      size_t size) {
    std::FILE* file = std::fopen(path.c_str(), mode);
    bool ok = file != nullptr &&
        (size == 0 || std::fwrite(data, 1, size, file) == size);
    const int saved = errno;
    if (file != nullptr && std::fclose(file) != 0) {
      ok = false;
    }
    if (!ok) {
      ET_LOG(
          Error, "%s: recording: cannot write %s: %s", kBackendId,
          path.c_str(), std::strerror(saved));
    }
    return ok;
  }

  std::mutex mutex_;
  std::string dir_;
  int64_t next_call_ = 0;
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

class CodecTosaBackend final : public BackendInterface {
 public:
  bool is_available() const override {
    return true;
  }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      ArrayRef<CompileSpec> /*compile_specs*/) const override {
    // Compile specs carry provenance only; execution needs just the payload
    // and, for a payload with external weights, the named data it lists.
    std::string error;
    const NamedDataMap* named_data = context.get_named_data_map();
    const FetchNamedData fetch = [named_data](
        const std::string& key, size_t expected_size, std::vector<uint8_t>* out,
        std::string* fetch_error) {
      return fetch_named_data(named_data, key, expected_size, out, fetch_error);
    };
    std::unique_ptr<TosaProgram> program = TosaProgram::parse(
        processed->data(), processed->size(), &error, &fetch);
    std::string hash = payload_hash(processed->data(), processed->size());
    // TosaProgram keeps its own copy, so the blob can go now.
    processed->Free();
    if (!program) {
      ET_LOG(Error, "%s: cannot load delegate: %s", kBackendId, error.c_str());
      return Error::DelegateInvalidCompatibility;
    }
    auto* delegate = new (std::nothrow) Delegate{std::move(program), std::move(hash)};
    if (delegate == nullptr) {
      return Error::MemoryAllocationFailed;
    }
    return static_cast<DelegateHandle*>(delegate);
  }

  Error execute(
      BackendExecutionContext& /*context*/,
      DelegateHandle* handle,
      Span<EValue*> args) const override {
    if (handle == nullptr) {
      return Error::DelegateInvalidHandle;
    }
    const Delegate& delegate = *static_cast<Delegate*>(handle);
    TosaProgram& program = *delegate.program;
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

    // Inputs are recorded before the run, so a call that fails still leaves
    // what it was given.
    const int64_t call = recorder().begin_call();
    for (size_t i = 0; call >= 0 && i < n_in; ++i) {
      recorder().write(call, delegate.hash, "in", i, program.inputs()[i], inputs[i]);
    }

    std::string error;
    if (!program.run(inputs, outputs, &error)) {
      ET_LOG(Error, "%s: execution failed: %s", kBackendId, error.c_str());
      return Error::Internal;
    }
    for (size_t i = 0; call >= 0 && i < n_out; ++i) {
      recorder().write(call, delegate.hash, "out", i, program.outputs()[i], outputs[i]);
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* handle) const override {
    delete static_cast<Delegate*>(handle);
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

// Turns the recorder on (a directory that exists) or off (NULL or ""); either
// way the call counter restarts at 0. See Recorder for what is written.
extern "C" __attribute__((visibility("default"))) void codec_tosa_record(
    const char* dir) {
  codec_tosa::recorder().set(dir);
}

// The hash a recording names a delegate by, over any bytes: Python hashes the
// payloads it reads from the .pte with this same code rather than a copy of it.
// `out` receives 16 hex digits and a NUL.
extern "C" __attribute__((visibility("default"))) void codec_tosa_payload_hash(
    const void* data, size_t size, char* out) {
  const std::string hash = codec_tosa::payload_hash(data, size);
  std::memcpy(out, hash.c_str(), hash.size() + 1);
}
