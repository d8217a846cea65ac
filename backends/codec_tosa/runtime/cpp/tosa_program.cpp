// TosaProgram: TOSA flatbuffer -> tosa-tools serialization handler -> TOSA
// reference model (TosaReference::IModelRunner).
#include "tosa_program.h"

#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

#include <zlib.h>

#include "flatbuffers/verifier.h"
#include "model_runner.h"
#include "tosa_serialization_handler.h"

namespace codec_tosa {
namespace {

// The reference model keeps its configuration in process globals
// (g_func_config, g_func_debug) that every IModelRunner overwrites, so runs in
// this library are serialised.
std::mutex& run_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Same settings as tosa_reference_model.run()'s defaults, so that this runtime
// and the Python reference-model path compute bit-identical results. In
// particular tosa_level NONE: level limits are a conformance check, not
// semantics, and the library default (8K) would reject large models that the
// Python path accepts.
func_config_t reference_config() {
  func_config_t config;
  config.tosa_level = func_config_t::NONE;
  config.precise_mode = 0;
  config.bounds_mode = false;
  config.eval = 1;
  config.validate_only = 0;
  config.output_tensors = 1;
  config.dump_intermediates = 0;
  return config;
}

bool to_element_type(tosa::DType dtype, ElementType* out) {
  switch (dtype) {
    case tosa::DType_FP32:
      *out = ElementType::kFloat32;
      return true;
    case tosa::DType_FP16:
      *out = ElementType::kFloat16;
      return true;
    case tosa::DType_INT8:
      *out = ElementType::kInt8;
      return true;
    case tosa::DType_INT16:
      *out = ElementType::kInt16;
      return true;
    case tosa::DType_INT32:
      *out = ElementType::kInt32;
      return true;
    case tosa::DType_BOOL:
      *out = ElementType::kBool;
      return true;
    default:
      return false;
  }
}

std::string shape_string(const std::vector<int32_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out << (i ? ", " : "") << shape[i];
  }
  out << "]";
  return out.str();
}

// Builds the boundary description of one named tensor of the main block.
bool describe_tensor(
    tosa::TosaSerializationBasicBlock& block,
    const std::string& name,
    TensorSpec* spec,
    std::string* error) {
  tosa::TosaSerializationTensor* tensor = block.GetTensorByName(name);
  if (tensor == nullptr) {
    *error = "main block names boundary tensor '" + name +
        "' but declares no such tensor";
    return false;
  }
  ElementType type;
  if (!to_element_type(tensor->GetDtype(), &type)) {
    *error = "boundary tensor '" + name + "' has TOSA dtype " +
        tosa::EnumNameDType(tensor->GetDtype()) +
        "; this runtime exchanges only FP32, FP16, INT8, INT16, INT32 and BOOL";
    return false;
  }
  size_t numel = 1;
  std::vector<int64_t> shape;
  for (int32_t dim : tensor->GetShape()) {
    if (dim < 0) {
      *error = "boundary tensor '" + name + "' has dynamic shape " +
          shape_string(tensor->GetShape()) + "; only static shapes run here";
      return false;
    }
    shape.push_back(dim);
    numel *= static_cast<size_t>(dim);
  }
  *spec = TensorSpec{name, type, std::move(shape), numel,
                     numel * element_size(type)};
  return true;
}

// Loads a TOSA flatbuffer into a handler. `bytes` must have passed the
// flatbuffers verifier: the handler itself does no bounds checking.
bool load_handler(
    const uint8_t* bytes,
    size_t size,
    tosa::TosaSerializationHandler* handler,
    std::string* error) {
  const tosa::tosa_err_t status = handler->LoadFileTosaFlatbuffer(bytes, size);
  if (status != tosa::TOSA_OK) {
    *error = "tosa serialization library rejected the payload (tosa_err_t " +
        std::to_string(static_cast<int>(status)) + ")";
    return false;
  }
  tosa::TosaSerializationRegion* region = handler->GetMainRegion();
  if (region == nullptr || region->GetBlocks().empty()) {
    *error = "TOSA payload has no main region/block";
    return false;
  }
  return true;
}

template <typename T>
bool set_input(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    const void* data) {
  const T* typed = static_cast<const T*>(data);
  std::vector<T> values(typed, typed + spec.numel);
  return runner.setInput<T>(spec.name, values) == 0;
}

// std::vector<bool> is bit-packed, so BOOL goes element by element; ExecuTorch
// stores one byte per bool.
template <>
bool set_input<bool>(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    const void* data) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  std::vector<bool> values(spec.numel);
  for (size_t i = 0; i < spec.numel; ++i) {
    values[i] = bytes[i] != 0;
  }
  return runner.setInput<bool>(spec.name, values) == 0;
}

template <typename T>
bool get_output(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    void* data) {
  std::vector<T> values = runner.getOutput<T>(spec.name);
  if (values.size() != spec.numel) {
    return false;
  }
  std::memcpy(data, values.data(), spec.nbytes);
  return true;
}

template <>
bool get_output<bool>(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    void* data) {
  std::vector<bool> values = runner.getOutput<bool>(spec.name);
  if (values.size() != spec.numel) {
    return false;
  }
  uint8_t* bytes = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < spec.numel; ++i) {
    bytes[i] = values[i] ? 1 : 0;
  }
  return true;
}

bool set_input_any(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    const void* data) {
  switch (spec.type) {
    case ElementType::kFloat32:
      return set_input<float>(runner, spec, data);
    case ElementType::kFloat16:
      // The runner's byte interface takes IEEE binary16, ExecuTorch's Half.
      return runner.setInput(spec.name, static_cast<uint8_t*>(const_cast<void*>(data)), spec.nbytes) == 0;
    case ElementType::kInt8:
      return set_input<int8_t>(runner, spec, data);
    case ElementType::kInt16:
      return set_input<int16_t>(runner, spec, data);
    case ElementType::kInt32:
      return set_input<int32_t>(runner, spec, data);
    case ElementType::kBool:
      return set_input<bool>(runner, spec, data);
  }
  return false;
}

bool get_output_any(
    TosaReference::IModelRunner& runner,
    const TensorSpec& spec,
    void* data) {
  switch (spec.type) {
    case ElementType::kFloat32:
      return get_output<float>(runner, spec, data);
    case ElementType::kFloat16:
      return runner.getOutput(spec.name, static_cast<uint8_t*>(data), spec.nbytes) == 0;
    case ElementType::kInt8:
      return get_output<int8_t>(runner, spec, data);
    case ElementType::kInt16:
      return get_output<int16_t>(runner, spec, data);
    case ElementType::kInt32:
      return get_output<int32_t>(runner, spec, data);
    case ElementType::kBool:
      return get_output<bool>(runner, spec, data);
  }
  return false;
}

const char* graph_status_name(GraphStatus status) {
  switch (status) {
    case GraphStatus::TOSA_VALID:
      return "VALID";
    case GraphStatus::TOSA_UNPREDICTABLE:
      return "UNPREDICTABLE";
    case GraphStatus::TOSA_ERROR:
      return "ERROR";
  }
  return "UNKNOWN";
}


// --- external weights (payload kExternalWeightsMagic) -------------------------
//
// Layout, little-endian:
//   0   char[4] "CTW1"
//   4   u32 header_size   offset of the TOSA flatbuffer, a multiple of 16
//   8   u32 entry_count
//   12  u32 encoding      0: the skeleton as it is, 1: zlib-deflated
//   16  entry_count x { u64 nbytes; u32 len + region name; u32 len + block name;
//                       u32 len + tensor name; u32 len + named-data key }
//   header_size: the skeleton TOSA flatbuffer; each listed tensor is a CONST
//                whose data is empty there and is `nbytes` bytes under `key`.
constexpr uint32_t kSkeletonRaw = 0;
constexpr uint32_t kSkeletonDeflated = 1;
struct ExternalEntry {
  uint64_t nbytes = 0;
  std::string region, block, tensor, key;
};

class HeaderReader {
 public:
  HeaderReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool u32(uint32_t* out) { return raw(out, 4); }
  bool u64(uint64_t* out) { return raw(out, 8); }
  bool str(std::string* out) {
    uint32_t len = 0;
    if (!u32(&len) || len > size_ - pos_) {
      return false;
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return true;
  }
  void seek(size_t pos) { pos_ = pos; }

 private:
  bool raw(void* out, size_t n) {
    if (n > size_ - pos_) {
      return false;
    }
    std::memcpy(out, data_ + pos_, n);  // little-endian hosts only, as TOSA
    pos_ += n;
    return true;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool parse_external_header(
    const uint8_t* bytes, size_t size, size_t* flatbuffer_offset,
    uint32_t* encoding, std::vector<ExternalEntry>* entries, std::string* error) {
  HeaderReader reader(bytes, size);
  reader.seek(4);
  uint32_t header_size = 0, count = 0;
  if (!reader.u32(&header_size) || !reader.u32(&count) || !reader.u32(encoding) ||
      header_size % 16 != 0 || header_size < 16 || header_size >= size ||
      (*encoding != kSkeletonRaw && *encoding != kSkeletonDeflated)) {
    *error = "external-weights payload has a malformed header";
    return false;
  }
  HeaderReader table(bytes, header_size);
  table.seek(16);
  for (uint32_t i = 0; i < count; ++i) {
    ExternalEntry entry;
    if (!table.u64(&entry.nbytes) || !table.str(&entry.region) ||
        !table.str(&entry.block) || !table.str(&entry.tensor) ||
        !table.str(&entry.key) || entry.key.empty()) {
      *error = "external-weights payload: side table entry " +
          std::to_string(i) + " is truncated or malformed";
      return false;
    }
    entries->push_back(std::move(entry));
  }
  *flatbuffer_offset = header_size;
  return true;
}

// The deflated skeleton, inflated into `out`.
bool inflate_skeleton(const uint8_t* data, size_t size, std::vector<uint8_t>* out,
                      std::string* error) {
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) {
    *error = "external-weights payload: zlib could not start";
    return false;
  }
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = static_cast<uInt>(size);
  out->resize(8 * size + 4096);
  int status = Z_OK;
  while (status == Z_OK) {
    if (stream.total_out == out->size()) {
      out->resize(2 * out->size());
    }
    stream.next_out = out->data() + stream.total_out;
    stream.avail_out = static_cast<uInt>(out->size() - stream.total_out);
    status = inflate(&stream, Z_NO_FLUSH);
  }
  out->resize(stream.total_out);
  inflateEnd(&stream);
  if (status != Z_STREAM_END) {
    *error = "external-weights payload: its skeleton does not inflate (zlib " +
        std::to_string(status) + ")";
    return false;
  }
  return true;
}

// Bytes a constant of this dtype and element count occupies in a TOSA
// flatbuffer, or 0 when this runtime does not know (then only non-emptiness is
// checked).
size_t serialized_nbytes(tosa::DType dtype, size_t numel) {
  switch (dtype) {
    case tosa::DType_BOOL:
    case tosa::DType_INT8:
    case tosa::DType_FP8E4M3:
    case tosa::DType_FP8E5M2:
      return numel;
    case tosa::DType_INT4:
      return (numel + 1) / 2;
    case tosa::DType_INT16:
    case tosa::DType_FP16:
    case tosa::DType_BF16:
      return 2 * numel;
    case tosa::DType_INT32:
    case tosa::DType_FP32:
      return 4 * numel;
    case tosa::DType_INT48:
      return 6 * numel;
    case tosa::DType_INT64:
      return 8 * numel;
    default:
      return 0;
  }
}

// Moves each listed constant's bytes into the handler. Every entry must name
// an existing tensor with no data whose size matches; afterwards every CONST
// in the graph must hold data (the reference model aborts the process on a
// CONST without data, so this must be an error here).
bool resolve_external(
    tosa::TosaSerializationHandler& handler,
    const std::vector<ExternalEntry>& entries, const FetchNamedData& fetch,
    size_t* fetched_bytes, std::string* error) {
  *fetched_bytes = 0;
  for (const ExternalEntry& entry : entries) {
    tosa::TosaSerializationRegion* region = handler.GetRegionByName(entry.region);
    tosa::TosaSerializationBasicBlock* block =
        region ? region->GetBlockByName(entry.block) : nullptr;
    tosa::TosaSerializationTensor* tensor =
        block ? block->GetTensorByName(entry.tensor) : nullptr;
    if (tensor == nullptr) {
      *error = "external weight '" + entry.tensor + "' (" + entry.region + "/" +
          entry.block + ") is not a tensor of the TOSA graph";
      return false;
    }
    if (!tensor->GetData().empty()) {
      *error = "external weight '" + entry.tensor +
          "' already has data in the TOSA graph";
      return false;
    }
    size_t numel = 1;
    for (int32_t dim : tensor->GetShape()) {
      numel *= dim < 0 ? 0 : static_cast<size_t>(dim);
    }
    const size_t expected = serialized_nbytes(tensor->GetDtype(), numel);
    if (expected != 0 && expected != entry.nbytes) {
      *error = "external weight '" + entry.tensor + "' is declared " +
          std::to_string(entry.nbytes) + " bytes, its shape and dtype need " +
          std::to_string(expected);
      return false;
    }
    std::vector<uint8_t> data;
    std::string fetch_error;
    if (!fetch(entry.key, entry.nbytes, &data, &fetch_error)) {
      *error = "weight " + entry.tensor + " " + entry.key + ": " + fetch_error;
      return false;
    }
    if (data.size() != entry.nbytes) {
      *error = "external weight '" + entry.tensor + "' (key " + entry.key +
          ") has " + std::to_string(data.size()) + " bytes in the named data, " +
          "the payload expects " + std::to_string(entry.nbytes);
      return false;
    }
    *fetched_bytes += data.size();
    tensor->SetData(std::move(data));
  }
  for (auto& region : handler.GetRegions()) {
    for (auto& block : region->GetBlocks()) {
      for (auto& op : block->GetOperators()) {
        if (op->GetOp() != tosa::Op_CONST) {
          continue;
        }
        for (const std::string& name : op->GetOutputNames()) {
          tosa::TosaSerializationTensor* tensor = block->GetTensorByName(name);
          if (tensor != nullptr && tensor->GetData().empty()) {
            *error = "CONST '" + name + "' has no data (an external weight "
                     "not listed in the payload's side table?)";
            return false;
          }
        }
      }
    }
  }
  return true;
}

}  // namespace

const char* element_type_name(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return "FP32";
    case ElementType::kFloat16:
      return "FP16";
    case ElementType::kInt8:
      return "INT8";
    case ElementType::kInt16:
      return "INT16";
    case ElementType::kInt32:
      return "INT32";
    case ElementType::kBool:
      return "BOOL";
  }
  return "?";
}

size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
    case ElementType::kInt32:
      return 4;
    case ElementType::kInt16:
    case ElementType::kFloat16:
      return 2;
    case ElementType::kInt8:
    case ElementType::kBool:
      return 1;
  }
  return 0;
}

struct TosaProgram::Impl {
  // Parsed once; owns deep copies of everything in the payload (constants
  // included), so ExecuTorch may free the delegate blob after init. The
  // reference model only reads it: SubgraphTraverser copies constant data out
  // of the handler when it allocates tensors.
  tosa::TosaSerializationHandler handler;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  size_t external_bytes = 0;
};

TosaProgram::TosaProgram(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TosaProgram::~TosaProgram() = default;

const std::vector<TensorSpec>& TosaProgram::inputs() const {
  return impl_->inputs;
}
const std::vector<TensorSpec>& TosaProgram::outputs() const {
  return impl_->outputs;
}
size_t TosaProgram::external_bytes() const {
  return impl_->external_bytes;
}

std::unique_ptr<TosaProgram> TosaProgram::parse(
    const void* data, size_t size, std::string* error,
    const FetchNamedData* fetch) {
  if (data == nullptr || size < 8) {
    *error = "TOSA payload is empty or truncated (" + std::to_string(size) +
        " bytes)";
    return nullptr;
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  std::vector<ExternalEntry> external;
  std::vector<uint8_t> inflated;  // the skeleton, while the handler reads it
  const bool has_external =
      std::memcmp(bytes, kExternalWeightsMagic, sizeof kExternalWeightsMagic) == 0;
  if (has_external) {
    size_t offset = 0;
    uint32_t encoding = kSkeletonRaw;
    if (!parse_external_header(bytes, size, &offset, &encoding, &external, error)) {
      return nullptr;
    }
    if (fetch == nullptr) {
      *error = "payload keeps its weights in named data, and no named data "
               "map was given";
      return nullptr;
    }
    bytes += offset;
    size -= offset;
    if (encoding == kSkeletonDeflated) {
      if (!inflate_skeleton(bytes, size, &inflated, error)) {
        return nullptr;
      }
      bytes = inflated.data();
      size = inflated.size();
    }
  }

  // The serialization handler trusts its input; verify first so that a
  // corrupt or foreign payload is an error, not a crash.
  flatbuffers::Verifier verifier(bytes, size);
  if (!tosa::VerifyTosaGraphBuffer(verifier)) {
    *error = "payload is not a valid TOSA flatbuffer (identifier or "
             "flatbuffers verification failed)";
    return nullptr;
  }

  std::lock_guard<std::mutex> lock(run_mutex());
  auto impl = std::make_unique<Impl>();
  tosa::TosaSerializationHandler& handler = impl->handler;
  if (!load_handler(bytes, size, &handler, error)) {
    return nullptr;
  }
  if (has_external &&
      !resolve_external(handler, external, *fetch, &impl->external_bytes, error)) {
    return nullptr;
  }
  tosa::TosaSerializationBasicBlock& block =
      *handler.GetMainRegion()->GetBlocks()[0];
  for (const std::string& name : block.GetInputs()) {
    TensorSpec spec;
    if (!describe_tensor(block, name, &spec, error)) {
      return nullptr;
    }
    impl->inputs.push_back(std::move(spec));
  }
  for (const std::string& name : block.GetOutputs()) {
    TensorSpec spec;
    if (!describe_tensor(block, name, &spec, error)) {
      return nullptr;
    }
    impl->outputs.push_back(std::move(spec));
  }

  // Let the reference model build and validate the graph now, so that an
  // unsupported graph fails at program load rather than at the first run.
  func_config_t config = reference_config();
  func_debug_t debug;
  TosaReference::IModelRunner runner(config, debug);
  const GraphStatus status = runner.initialize(handler);
  if (status != GraphStatus::TOSA_VALID) {
    *error = std::string("TOSA reference model rejected the graph: ") +
        graph_status_name(status);
    return nullptr;
  }
  return std::unique_ptr<TosaProgram>(new TosaProgram(std::move(impl)));
}

bool TosaProgram::run(
    const std::vector<const void*>& inputs,
    const std::vector<void*>& outputs,
    std::string* error) {
  if (inputs.size() != impl_->inputs.size() ||
      outputs.size() != impl_->outputs.size()) {
    *error = "expected " + std::to_string(impl_->inputs.size()) +
        " inputs and " + std::to_string(impl_->outputs.size()) +
        " outputs, got " + std::to_string(inputs.size()) + " and " +
        std::to_string(outputs.size());
    return false;
  }
  std::lock_guard<std::mutex> lock(run_mutex());

  // A fresh runner per run: the reference model's graph traverser is not
  // designed to be re-evaluated (each node is scheduled once, as its inputs
  // become ready), and building it costs little next to evaluating it.
  func_config_t config = reference_config();
  func_debug_t debug;
  TosaReference::IModelRunner runner(config, debug);
  GraphStatus status = runner.initialize(impl_->handler);
  if (status != GraphStatus::TOSA_VALID) {
    *error = std::string("reference model initialisation failed: ") +
        graph_status_name(status);
    return false;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!set_input_any(runner, impl_->inputs[i], inputs[i])) {
      *error = "reference model refused input '" + impl_->inputs[i].name + "'";
      return false;
    }
  }
  status = runner.run();
  if (status != GraphStatus::TOSA_VALID) {
    *error = std::string("reference model run finished with status ") +
        graph_status_name(status);
    return false;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!get_output_any(runner, impl_->outputs[i], outputs[i])) {
      *error = "could not read output '" + impl_->outputs[i].name +
          "' from the reference model";
      return false;
    }
  }
  return true;
}

}  // namespace codec_tosa
