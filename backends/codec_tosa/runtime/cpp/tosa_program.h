// A parsed TOSA flatbuffer that can be run on the TOSA reference model.
//
// Deliberately free of ExecuTorch and tosa-tools types so that the ExecuTorch
// glue (codec_tosa_backend.cpp) and the reference-model code compile
// independently: the glue only sees names, dtypes, shapes and byte buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace codec_tosa {

// The element types this runtime can exchange with ExecuTorch. Anything else
// at the graph boundary makes `TosaProgram::parse` fail.
enum class ElementType { kFloat32, kFloat16, kInt8, kInt16, kInt32, kBool };

const char* element_type_name(ElementType type);
size_t element_size(ElementType type);

struct TensorSpec {
  std::string name;
  ElementType type;
  std::vector<int64_t> shape;
  size_t numel;
  size_t nbytes;
};

// Fetches the bytes stored under a named-data key into `out` (resized to the
// blob's size). Returns false and fills `error` if the key cannot be read.
// The ExecuTorch glue implements it over the delegate's NamedDataMap.
using FetchNamedData = std::function<bool(
    const std::string& key, size_t expected_size, std::vector<uint8_t>* out,
    std::string* error)>;

// The magic of a payload whose large constants live in named data
// ("external weights"): a small header (the side table) followed by the TOSA
// flatbuffer in which those constants have no data. See parse().
constexpr char kExternalWeightsMagic[4] = {'C', 'T', 'W', '1'};

class TosaProgram {
 public:
  // Verifies and parses `size` bytes of a TOSA flatbuffer into a deep copy
  // (the caller may free `data` afterwards), and checks that the reference
  // model accepts the main block. Returns nullptr and fills `error` on
  // failure.
  //
  // A payload that starts with kExternalWeightsMagic is a side table plus a
  // skeleton flatbuffer; each listed constant's bytes are fetched through
  // `fetch` (which must then be non-null) and moved into the parsed graph, so
  // the reference model sees the complete graph.
  static std::unique_ptr<TosaProgram> parse(
      const void* data, size_t size, std::string* error,
      const FetchNamedData* fetch = nullptr);

  // Bytes of constant data fetched from named data by parse() (0 for an
  // inline payload).
  size_t external_bytes() const;

  ~TosaProgram();
  TosaProgram(const TosaProgram&) = delete;
  TosaProgram& operator=(const TosaProgram&) = delete;

  // The main block's inputs and outputs, in the block's declared order.
  const std::vector<TensorSpec>& inputs() const;
  const std::vector<TensorSpec>& outputs() const;

  // Runs the graph once. inputs[i] / outputs[i] point at contiguous buffers of
  // exactly inputs()[i].nbytes / outputs()[i].nbytes bytes. Returns false and
  // fills `error` if the reference model rejects or fails the run.
  bool run(
      const std::vector<const void*>& inputs,
      const std::vector<void*>& outputs,
      std::string* error);

 private:
  struct Impl;
  explicit TosaProgram(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace codec_tosa
