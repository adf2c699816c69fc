// fused_moe's XLA FFI binding, shared by the CPU handlers (moe_cpu.cc) and the CUDA handlers
// (moe.cu): each op's operands, results and attributes, declared once (Bind*), decoded and
// validated once (Handlers, in the words of the Python shape rule), then handed as a Call to
// the platform's body. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "moe_limits.h"
#include "xla/ffi/api/ffi.h"
#include "xla_kernels/errors.h"

namespace xla_kernels::moe {

namespace ffi = xla::ffi;

constexpr const char* kOp = "xla_kernels.fused_moe";
constexpr const char* kOpFp8 = "xla_kernels.fused_moe_fp8";
// Expert parallel: w13/w2 hold a block of the experts; router_logits has every expert's
// column, and the int32 scalar `expert_offset` is the global id of the first local expert.
constexpr const char* kOpEp = "xla_kernels.fused_moe_ep";
constexpr const char* kOpFp8Ep = "xla_kernels.fused_moe_fp8_ep";

inline bool IsFp8Op(const char* op) {
  return std::string_view(op) == kOpFp8 || std::string_view(op) == kOpFp8Ep;
}
inline bool IsEpOp(const char* op) {
  return std::string_view(op) == kOpEp || std::string_view(op) == kOpFp8Ep;
}

enum class Activation { kSilu, kGelu };

struct Shape {
  // experts: those of w13/w2 (local); routed: router_logits' columns, the experts the
  // routing chooses among (== experts except for the expert-parallel ops).
  int64_t tokens, hidden, experts, routed, inter, top_k, pairs;
  ffi::DataType dtype, logits_dtype;
  bool renormalize;
  Activation activation;
  bool fp8;
  int64_t bn, bk;  // fp8 scale blocks, (1, 0) for per-channel scales (see ScaleIndex)
};

inline bool IsFloat(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

// Checks what every handler needs; `fp8` calls also pass their scales and block_shape.
inline ffi::Error Decode(const char* op, const ffi::AnyBuffer& hidden,
                         const ffi::AnyBuffer& logits, const ffi::AnyBuffer& w13,
                         const ffi::AnyBuffer& w2, const ffi::AnyBuffer& out,
                         const ffi::AnyBuffer& ws_i32, const ffi::AnyBuffer& ws_f32,
                         const ffi::AnyBuffer& ws_act, int64_t top_k, bool renormalize,
                         std::string_view activation, Shape* s) {
  const auto hd = hidden.dimensions(), ld = logits.dimensions(), ad = w13.dimensions(),
             bd = w2.dimensions();
  if (hd.size() != 2 || !IsFloat(hidden.element_type()))
    return InvalidArgument(op, "hidden", "expected [tokens, hidden] of f32, bf16 or f16",
                           "pass a rank-2 floating array");
  s->tokens = hd[0];
  s->hidden = hd[1];
  s->dtype = hidden.element_type();
  s->logits_dtype = logits.element_type();
  if (ad.size() != 3 || ad[1] % 2 || ad[1] == 0 || ad[2] != s->hidden)
    return InvalidArgument(op, "w13", "expected [experts, 2 * intermediate, hidden], got " +
                                          DimsText(ad),
                           "stack each expert's gate and up projections");
  s->experts = ad[0];
  s->inter = ad[1] / 2;
  if (s->experts < 1 || s->experts > kMaxExperts)
    return InvalidArgument(op, "w13", "expected 1 to " + std::to_string(kMaxExperts) +
                                          " experts", "split the experts into groups");
  if (bd.size() != 3 || bd[0] != s->experts || bd[1] != s->hidden || bd[2] != s->inter)
    return InvalidArgument(op, "w2", "expected [experts, hidden, intermediate], got " +
                                         DimsText(bd),
                           "pass each expert's down projection");
  if (ld.size() != 2 || ld[0] != s->tokens || !IsFloat(s->logits_dtype) ||
      (IsEpOp(op) ? ld[1] < s->experts || ld[1] > kMaxExperts : ld[1] != s->experts))
    return InvalidArgument(op, "router_logits",
                           IsEpOp(op) ? "expected [tokens, global experts] of f32, bf16 or "
                                        "f16 with w13's experts <= global experts <= " +
                                            std::to_string(kMaxExperts) + ", got " +
                                            DimsText(ld)
                                      : "expected [tokens, experts] of f32, bf16 or f16, got " +
                                            DimsText(ld),
                           "pass one logit per token and expert (every expert's)");
  s->routed = ld[1];
  if (s->hidden < 1)
    return InvalidArgument(op, "hidden", "hidden size must be >= 1", "pass non-empty rows");
  if (top_k < 1 || top_k > s->routed || top_k > kMaxTopK)
    return InvalidArgument(op, "top_k", "must be in 1 .. min(experts, " +
                                            std::to_string(kMaxTopK) + "), got " +
                                            std::to_string(top_k),
                           "route each token to fewer experts");
  s->top_k = top_k;
  s->pairs = s->tokens * top_k;
  if (s->pairs > kMaxPairs)
    return InvalidArgument(op, "hidden", "tokens * top_k is above " + std::to_string(kMaxPairs),
                           "split the tokens into several calls");
  if (activation == "silu") {
    s->activation = Activation::kSilu;
  } else if (activation == "gelu") {
    s->activation = Activation::kGelu;
  } else {
    return InvalidArgument(op, "activation", "unknown activation '" + std::string(activation) +
                                                 "'", "pass 'silu' or 'gelu'");
  }
  s->renormalize = renormalize;
  const ffi::DataType wt = w13.element_type();
  s->fp8 = wt == ffi::DataType::F8E4M3FN;
  if (w2.element_type() != wt || (!s->fp8 && wt != s->dtype) ||
      s->fp8 != IsFp8Op(op))
    return InvalidArgument(op, "w13", "w13 and w2 must both have hidden's dtype (fused_moe) or "
                           "both be f8e4m3fn (fused_moe_fp8)", "cast the weights");
  if (out.element_type() != s->dtype || out.element_count() != hidden.element_count())
    return InvalidArgument(op, "out", "must have hidden's shape and dtype", "allocate it so");
  if (ws_i32.element_type() != ffi::DataType::S32 ||
      static_cast<int64_t>(ws_i32.element_count()) < WorkspaceI32(s->pairs, s->experts) ||
      ws_f32.element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(ws_f32.element_count()) < WorkspaceF32(s->pairs) ||
      ws_act.element_type() != s->dtype ||
      static_cast<int64_t>(ws_act.element_count()) <
          WorkspaceAct(s->pairs, s->inter, s->hidden))
    return InvalidArgument(op, "workspace", "the workspaces are smaller than the call needs",
                           "allocate workspace_sizes(tokens, experts, top_k, intermediate, "
                           "hidden) elements (int32, f32, hidden's dtype)");
  s->bn = 1;
  s->bk = 0;
  return ffi::Error::Success();
}

// fp8 scales: per output channel ([experts, rows, 1], block_shape (0, 0)) or per (bn x bk)
// block ([experts, ceil(rows / bn), ceil(cols / bk)]).
inline ffi::Error DecodeScale(const char* op, const char* name, const ffi::AnyBuffer& scale, int64_t experts,
                              int64_t rows, int64_t cols, int64_t bn, int64_t bk) {
  const auto d = scale.dimensions();
  const int64_t want1 = bn == 0 ? rows : CeilDiv(rows, bn);
  const int64_t want2 = bn == 0 ? 1 : CeilDiv(cols, bk);
  if (scale.element_type() != ffi::DataType::F32 || d.size() != 3 || d[0] != experts ||
      d[1] != want1 || d[2] != want2)
    return InvalidArgument(op, name, "expected f32 [" + std::to_string(experts) + ", " +
                                             std::to_string(want1) + ", " +
                                             std::to_string(want2) + "], got " + DimsText(d),
                           "pass the scales the weights were quantized with");
  return ffi::Error::Success();
}

inline ffi::Error DecodeScales(const char* op, const ffi::AnyBuffer& w13_scale, const ffi::AnyBuffer& w2_scale,
                               ffi::Span<const int64_t> block_shape, Shape* s) {
  if (block_shape.size() != 2)
    return InvalidArgument(op, "block_shape", "expected two sizes", "pass (bn, bk)");
  const int64_t bn = block_shape[0], bk = block_shape[1];
  if (!((bn == 0 && bk == 0) || (bn >= 1 && bk >= 1)))
    return InvalidArgument(op, "block_shape", "expected (0, 0) or two sizes >= 1",
                           "pass (128, 128) or (0, 0)");
  ffi::Error err = DecodeScale(op, "w13_scale", w13_scale, s->experts, 2 * s->inter, s->hidden,
                               bn, bk);
  if (err.failure()) return err;
  err = DecodeScale(op, "w2_scale", w2_scale, s->experts, s->hidden, s->inter, bn, bk);
  if (err.failure()) return err;
  // A per-channel scale is a block of one row spanning every column.
  s->bn = bn == 0 ? 1 : bn;
  s->bk = bn == 0 ? 0 : bk;
  return ffi::Error::Success();
}

// The expert-parallel ops' `expert_offset`: an int32 scalar. Any value is accepted: local
// expert i is global expert expert_offset + i, and tokens routed to a global expert outside
// [expert_offset, expert_offset + experts) add nothing on this shard.
inline ffi::Error DecodeOffset(const char* op, const ffi::AnyBuffer& offset) {
  if (offset.element_type() != ffi::DataType::S32 || offset.dimensions().size() != 0)
    return InvalidArgument(op, "expert_offset", "expected an int32 scalar, got " +
                                                    DimsText(offset.dimensions()),
                           "pass the global id of w13's first expert as an int32 scalar");
  return ffi::Error::Success();
}

// A validated call, as a platform's body computes it: the shape and the buffers' addresses.
struct Call {
  Shape s;
  const char* op;  // for the body's own messages
  const void* hidden;
  const void* logits;
  const void* w13;
  const void* w2;
  const float* w13_scale;  // the fp8 ops' scales, else null
  const float* w2_scale;
  // The expert-parallel ops' int32 scalar, where XLA placed it (host memory for the CPU
  // handlers, device memory for CUDA's), else null: local expert 0 is global expert 0.
  const int32_t* expert_offset;
  void* out;
  void* ws_i32;  // the workspaces (the CUDA kernels'; the CPU body leaves them alone)
  void* ws_f32;
  void* ws_act;
};

using Operand = ffi::AnyBuffer;
using Output = ffi::Result<ffi::AnyBuffer>;

// The Bind* functions take the binding by reference: a Binding moves only through its own
// methods (its converting constructor is private).

// The results and attributes every op binds after its operands.
template <typename Binding>
auto BindResultsAndAttrs(Binding&& binding) {
  return std::move(binding).template Ret<ffi::AnyBuffer>()  // out
      .template Ret<ffi::AnyBuffer>()                       // ws_i32
      .template Ret<ffi::AnyBuffer>()                       // ws_f32
      .template Ret<ffi::AnyBuffer>()                       // ws_act
      .template Attr<int64_t>("top_k")
      .template Attr<bool>("renormalize")
      .template Attr<std::string_view>("activation");
}

// The operands every op starts with.
template <typename Binding>
auto BindInputs(Binding&& binding) {
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // hidden
      .template Arg<ffi::AnyBuffer>()                       // router_logits
      .template Arg<ffi::AnyBuffer>()                       // w13
      .template Arg<ffi::AnyBuffer>();                      // w2
}

// Each op's operands, results and attributes, in order; the CUDA handlers pass a binding
// that already holds their stream.
template <typename Binding>
auto BindFusedMoe(Binding&& binding) {
  return BindResultsAndAttrs(BindInputs(std::move(binding)));
}

template <typename Binding>
auto BindFusedMoeFp8(Binding&& binding) {
  return BindResultsAndAttrs(BindInputs(std::move(binding))
                                 .template Arg<ffi::AnyBuffer>()   // w13_scale
                                 .template Arg<ffi::AnyBuffer>())  // w2_scale
      .template Attr<ffi::Span<const int64_t>>("block_shape");
}

template <typename Binding>
auto BindFusedMoeEp(Binding&& binding) {
  return BindResultsAndAttrs(BindInputs(std::move(binding))
                                 .template Arg<ffi::AnyBuffer>());  // expert_offset
}

template <typename Binding>
auto BindFusedMoeFp8Ep(Binding&& binding) {
  return BindResultsAndAttrs(BindInputs(std::move(binding))
                                 .template Arg<ffi::AnyBuffer>()   // w13_scale
                                 .template Arg<ffi::AnyBuffer>()   // w2_scale
                                 .template Arg<ffi::AnyBuffer>())  // expert_offset
      .template Attr<ffi::Span<const int64_t>>("block_shape");
}

// The four ops' handlers (each bound by its Bind* above) for a platform whose
// `kCompute(ctx..., call)` computes a validated Call; `Ctx` is what the platform's binding
// passes before the operands (CUDA: its stream; the CPU: nothing).
template <auto kCompute, typename... Ctx>
struct Handlers {
  static ffi::Error FusedMoe(Ctx... ctx, Operand hidden, Operand logits, Operand w13,
                             Operand w2, Output out, Output ws_i32, Output ws_f32,
                             Output ws_act, int64_t top_k, bool renormalize,
                             std::string_view activation) {
    return Handle(ctx..., kOp, hidden, logits, w13, w2, nullptr, nullptr, nullptr, out, ws_i32,
                  ws_f32, ws_act, top_k, renormalize, activation, {});
  }

  static ffi::Error FusedMoeFp8(Ctx... ctx, Operand hidden, Operand logits, Operand w13,
                                Operand w2, Operand w13_scale, Operand w2_scale, Output out,
                                Output ws_i32, Output ws_f32, Output ws_act, int64_t top_k,
                                bool renormalize, std::string_view activation,
                                ffi::Span<const int64_t> block_shape) {
    return Handle(ctx..., kOpFp8, hidden, logits, w13, w2, &w13_scale, &w2_scale, nullptr, out,
                  ws_i32, ws_f32, ws_act, top_k, renormalize, activation, block_shape);
  }

  static ffi::Error FusedMoeEp(Ctx... ctx, Operand hidden, Operand logits, Operand w13,
                               Operand w2, Operand expert_offset, Output out, Output ws_i32,
                               Output ws_f32, Output ws_act, int64_t top_k, bool renormalize,
                               std::string_view activation) {
    return Handle(ctx..., kOpEp, hidden, logits, w13, w2, nullptr, nullptr, &expert_offset, out,
                  ws_i32, ws_f32, ws_act, top_k, renormalize, activation, {});
  }

  static ffi::Error FusedMoeFp8Ep(Ctx... ctx, Operand hidden, Operand logits, Operand w13,
                                  Operand w2, Operand w13_scale, Operand w2_scale,
                                  Operand expert_offset, Output out, Output ws_i32,
                                  Output ws_f32, Output ws_act, int64_t top_k, bool renormalize,
                                  std::string_view activation,
                                  ffi::Span<const int64_t> block_shape) {
    return Handle(ctx..., kOpFp8Ep, hidden, logits, w13, w2, &w13_scale, &w2_scale,
                  &expert_offset, out, ws_i32, ws_f32, ws_act, top_k, renormalize, activation,
                  block_shape);
  }

 private:
  // Every op's decoding: the common operands (Decode), the fp8 ops' scales (DecodeScales,
  // where w13_scale is given), the expert-parallel ops' offset (DecodeOffset, where given).
  static ffi::Error Handle(Ctx... ctx, const char* op, const Operand& hidden,
                           const Operand& logits, const Operand& w13, const Operand& w2,
                           const Operand* w13_scale, const Operand* w2_scale,
                           const Operand* expert_offset, Output& out, Output& ws_i32,
                           Output& ws_f32, Output& ws_act, int64_t top_k, bool renormalize,
                           std::string_view activation, ffi::Span<const int64_t> block_shape) {
    Call c{};
    c.op = op;
    ffi::Error err = Decode(op, hidden, logits, w13, w2, *out, *ws_i32, *ws_f32, *ws_act, top_k,
                            renormalize, activation, &c.s);
    if (err.failure()) return err;
    c.hidden = hidden.untyped_data();
    c.logits = logits.untyped_data();
    c.w13 = w13.untyped_data();
    c.w2 = w2.untyped_data();
    c.out = out->untyped_data();
    c.ws_i32 = ws_i32->untyped_data();
    c.ws_f32 = ws_f32->untyped_data();
    c.ws_act = ws_act->untyped_data();
    if (w13_scale != nullptr) {
      err = DecodeScales(op, *w13_scale, *w2_scale, block_shape, &c.s);
      if (err.failure()) return err;
      c.w13_scale = static_cast<const float*>(w13_scale->untyped_data());
      c.w2_scale = static_cast<const float*>(w2_scale->untyped_data());
    }
    if (expert_offset != nullptr) {
      err = DecodeOffset(op, *expert_offset);
      if (err.failure()) return err;
      c.expert_offset = static_cast<const int32_t*>(expert_offset->untyped_data());
    }
    return kCompute(ctx..., c);
  }
};

}  // namespace xla_kernels::moe

// Defines the four ops' handler symbols XkFusedMoe<P>, XkFusedMoeFp8<P>, XkFusedMoeEp<P> and
// XkFusedMoeFp8Ep<P> (P: the platform, Cpu or Cuda): the functions of HANDLERS (a Handlers)
// under the bindings Bind*(BINDING) (BINDING: ffi::Ffi::Bind() and the platform's context),
// with the handler traits that follow, if any.
#define XK_MOE_DEFINE_HANDLERS(P, HANDLERS, BINDING, ...)                                  \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoe##P, HANDLERS::FusedMoe,                         \
                                ::xla_kernels::moe::BindFusedMoe(BINDING), ##__VA_ARGS__); \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeFp8##P, HANDLERS::FusedMoeFp8,                   \
                                ::xla_kernels::moe::BindFusedMoeFp8(BINDING),              \
                                ##__VA_ARGS__);                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeEp##P, HANDLERS::FusedMoeEp,                     \
                                ::xla_kernels::moe::BindFusedMoeEp(BINDING),               \
                                ##__VA_ARGS__);                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(XkFusedMoeFp8Ep##P, HANDLERS::FusedMoeFp8Ep,               \
                                ::xla_kernels::moe::BindFusedMoeFp8Ep(BINDING),            \
                                ##__VA_ARGS__)
