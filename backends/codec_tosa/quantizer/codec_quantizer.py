"""CodecQuantizer: the codec plan as a PT2E quantizer (docs/DESIGN.md, "The plan as a PT2E quantizer").

Arm's documented integer flow is PT2E: ``prepare_pt2e(exported.module(),
quantizer)``, calibrate, ``convert_pt2e``, export, and lower with a stock
partitioner (`TOSAPartitioner` at TOSA-1.0+INT, `EthosUPartitioner`,
`VgfPartitioner`). `CodecQuantizer` is the one line a user swaps in: its
annotations *are* the plan.

* What differs between targets is the spec's target's `Int8Flow` (`targets.base`): Arm's
  INT flow (TOSA-1.0+INT, Ethos-U, VGF) or XNNPACK's.
* `transform_for_annotation` is the target's, so the graph is decomposed exactly as
  Arm's INT flow decomposes it (softmax, layer norm, means, ...), or rewritten
  into operators XNNPACK runs on codes (`_passes/xnnpack_rewrites`).
* `annotate` asks the target which operators its INT8 flow takes (Arm's own
  quantizer, on a copy; the table's ``xnnpack`` kernels): the others stay FP32
  (plain ports). On the graph as it is, the
  placement (`codec_tosa.placement.place`, the same core the partitioner
  uses) places the domains, from our commutation table's rows; at the
  integer policy an operator Arm takes that the table has no integer row
  for keeps Arm's own annotation of its ports (`_derived_rows`).
* Each domain becomes one sharing group, whose one observer is our codec's
  (`observers.DomainObserver`) and sees every tensor of the domain: a
  `QuantizationSpec` at the domain's first port, a `SharedQuantizationSpec`
  of it at every other. A port of another domain reading the value is a transcode (PT2E
  gives it an observer of its own: ``q_s dq_s q_d dq_d``, one RESCALE); a
  plain reader reads the dequantize (a decode). Weights are encoded as the
  plan encodes them (`observers.WeightObserver`), biases as int32 codes at
  ``s_in * s_w`` (`observers.bias_qparams`).
* Each domain's width is the spec's precision (`codec_tosa.quantizer.precision`): an INT16
  domain's qspecs are symmetric int16 (Arm's a16w8 range). At ``auto`` every
  domain is annotated INT8, and `choose_precision`, after calibration, sets the
  widths the search picks on the observers that convert_pt2e reads.
  Weights likewise: INT8, or INT4 where the row and the input domain allow
  (`precision.int4_weights`), Arm's a8w4 range on the weight's observer.
* Implicit sharing is off: PT2E would otherwise merge a transcode into the
  producer's group, because both quantize "the same tensor".
* A relu or relu6 right after a convolution or linear is annotated as Arm
  annotates it (nothing quantized between them), so Arm's
  FuseQuantizedActivationPass folds it (the table's `fuses_activation`), where
  the domain holds no negative value (Arm's fold saturates at -128); at
  XNNPACK, every activation its kernel folds (the kernel's `fuses`). Not in an
  INT16 domain: Arm's quantizer quantizes between them at a16w8, and Arm's
  lowering of the folded pair at int16 drops the relu (measured:
  tests/test_precision.py pins it upstream).

After calibration, `planned(program)` is the plan's record
(`planning.PlannedProgram`, thetas read off the observers) for the
simulation, `codec-tosa validate` and `codec_tosa.save`.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Mapping

import torch
import torch.fx
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner, PartitionResult
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from codec_tosa._passes.materialize_codecs import ARM_ANNOTATION_KEY
from codec_tosa.codecs.base import Theta
from codec_tosa.codecs.int16 import QMAX16, QMIN16
from codec_tosa.commutation.table import CLAMPING_TARGETS, INT16_DERIVED_TARGETS, OUT, CommutationTable, Row
from codec_tosa.graph import CONSTANT, PortGraph
from codec_tosa.placement import Placement, place
from codec_tosa.placement.plan import Domain
from codec_tosa.placement.semantics import CODE, WEIGHT
from codec_tosa.planning.program import PlannedProgram
from codec_tosa.quantizer.annotation import Annotation, Key
from codec_tosa.quantizer.module_selection import ModuleSelection
from codec_tosa.quantizer.observers import (
    INT32_QMAX,
    INT32_QMIN,
    DomainObserver,
    WeightObserver,
    bias_qparams,
    weight_range,
)
from codec_tosa.quantizer.precision import (
    BITS4,
    BITS8,
    BITS16,
    DomainPrecision,
    Groups,
    Int4Weight,
    WeightPrecision,
    assign,
    assign_weights,
    chain_cuts,
    int4_weights,
    int16_groups,
    kept_int8,
    undone_cuts,
)
from codec_tosa.quantizer.search import search
from codec_tosa.quantizer.weight_rounding import apply_rounded, round_weights
from codec_tosa.spec import AUTO, GPTQ, INT8, INT16, CodecSpec
from codec_tosa.targets import target_of, target_of_compile_spec
from codec_tosa.targets.base import Int8Flow

EdgeOrNode = Any  # torch.fx.Node (its output) or (producer, consumer) (an input edge)

_QMIN, _QMAX = -128, 127


class CodecQuantizer(Quantizer):
    """A PT2E quantizer whose annotations are the codec plan of `spec` (default policy I).

    Use it where Arm's flow uses `TOSAQuantizer` or `EthosUQuantizer`::

        quantizer = CodecQuantizer(CodecSpec(policy="I", target="ethos-u55-128"))
        prepared = prepare_pt2e(torch.export.export(model, x).module(check_guards=False), quantizer)
        for batch in calibration: prepared(*batch)
        ep = torch.export.export(convert_pt2e(prepared), x)
        to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(EthosUCompileSpec("ethos-u55-128"))])
    """

    def __init__(self, spec: Any = None) -> None:
        """`spec`: a `CodecSpec` (default policy I, target tosa), or the Arm compile spec a
        stock quantizer takes (`EthosUQuantizer(compile_spec)` -> `CodecQuantizer(compile_spec)`:
        policy I for its target)."""
        super().__init__()
        if spec is not None and not isinstance(spec, CodecSpec):
            spec = CodecSpec(policy="I", target=target_of_compile_spec(spec).name)
        self.spec = spec or CodecSpec(policy="I")
        # what differs between Arm's INT flow and XNNPACK's (targets.base.Int8Flow)
        target = target_of(self.spec.target)
        target.check_spec(self.spec)  # e.g. external weights on a target without named data
        self._flow: Int8Flow = target.int8_flow(self.spec)
        # set_global / set_module_type / set_module_name (module_selection)
        self._selection = ModuleSelection(self.spec, self.spec)
        self._annotated: Annotation | None = None
        self._observers: dict[Key, Any] = {}  # PT2E's observer of each annotated edge and node
        self._reuse: dict[Key, Any] | None = None  # calibrated observers, for `converted`
        self._chosen: list[DomainPrecision] | None = None  # the precision search's widths
        self._chosen_weights: list[WeightPrecision] | None = None
        self._cuts: tuple[int, ...] | None = None  # the chain cuts the search kept (split_chains)
        self.search_result: Any = None  # precision_search.SearchResult, after `choose_precision`
        # at weight_rounding gptq, after `choose_precision`: operator node -> why its
        # weight kept nearest rounding
        self.rounding_skipped: dict[str, str] = {}

    # ---- module selection, as the stock quantizers select ------------------
    def set_global(self, spec: CodecSpec | None) -> CodecQuantizer:
        """The spec of every operator no module setter selects; None leaves them out of the
        plan (they run as the target runs unquantized operators). `module_selection`."""
        self._selection.set_global(spec)
        return self

    def set_module_type(self, module_type: type, spec: CodecSpec | None) -> CodecQuantizer:
        """The spec of the operators of every module of `module_type` (None: left out)."""
        self._selection.set_module_type(module_type, spec)
        return self

    def set_module_name(self, name: str, spec: CodecSpec | None) -> CodecQuantizer:
        """The spec of the operators of the module named `name` (None: left out)."""
        self._selection.set_module_name(name, spec)
        return self

    # ---- Quantizer interface ---------------------------------------------
    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        if self._reuse is not None:
            return model  # `converted` re-prepares a graph that is transformed already
        if self._selection.selective:
            self._flow.select(self._selection)  # the target's own flow decomposes what it quantizes
        return _guards_kept(model, self._flow.transform_for_annotation)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        _constants_typed(model)
        _constants_detached(model)
        fp32 = copy.deepcopy(model)
        arm = self._flow.annotations(model)  # Arm's quantizer's; none for XNNPACK
        graph = PortGraph.from_fx(model)
        table, derived = self._table(graph, arm)
        plain = tuple(sorted(set(self._flow.plain_ops(graph, table, arm)) | set(self._left_out(graph))))
        placement = self._place(graph, table, plain, ())
        cuts = self._cuts
        if cuts is None and self.spec.split_chains:
            cuts = chain_cuts(graph, placement, table)
        if cuts:
            placement = self._place(graph, table, plain, cuts)
        annotator = self._laid_out(graph, placement, table, arm, derived)
        annotator.write()
        self._annotated = self._record(annotator, fp32, derived, plain, cuts or ())
        return model

    def _place(self, graph: PortGraph, table: CommutationTable, plain: tuple[int, ...],
               cuts: tuple[int, ...]) -> Placement:
        return place(graph, table, self.spec.policy, self.spec.placement,
                     fused_transcode=self.spec.fused_transcode, plain_ops=plain, cuts=cuts)

    def _laid_out(self, graph: PortGraph, placement: Placement, table: CommutationTable,
                  arm: Mapping[str, QuantizationAnnotation], derived: tuple[str, ...]) -> _Annotator:
        """The annotation of `placement` at the widths this quantizer has (not written yet)."""
        groups = int16_groups(graph, placement, table)
        precisions = self._precisions(groups, len(placement.plan.domains), graph, placement)
        bits = {p.domain: p.bits for p in precisions}
        int4 = [w for w in int4_weights(graph, placement, table) if graph.op_target[w.op] not in derived]
        weight_precisions = self._weight_precisions(int4, bits, graph)
        annotator = _Annotator(graph, placement, table, self.spec, arm, frozenset(derived), self._flow, bits,
                               {w.op: w.bits for w in weight_precisions})
        annotator.groups, annotator.precisions = groups, precisions
        annotator.int4, annotator.weight_precisions = int4, weight_precisions
        return annotator

    def _record(self, annotator: _Annotator, fp32: torch.fx.GraphModule, derived: tuple[str, ...],
                plain: tuple[int, ...], cuts: tuple[int, ...],
                weight_roots: dict[int, Key] | None = None) -> Annotation:
        graph, placement = annotator.g, annotator.placement
        return Annotation(graph, placement, {d: _key(e) for d, e in annotator.root.items()}, fp32, derived,
                          annotator.groups, annotator.precisions, annotator.fused_pairs(), annotator.int4,
                          annotator.weight_precisions, weight_roots or annotator.weight_roots, annotator.table,
                          annotator.arm, plain, cuts)

    def _precisions(self, groups: Groups, num_domains: int, graph: PortGraph,
                    placement: Placement) -> list[DomainPrecision]:
        if self._chosen is not None:
            return list(self._chosen)
        if self.spec.precision == AUTO:  # INT8 until `choose_precision` runs the search
            return [DomainPrecision(d, BITS8, groups.blocked.get(d, "auto: not searched yet"))
                    for d in range(num_domains)]
        if not self._selection.selective:
            return assign(self.spec, groups, num_domains)
        asked: dict[int, str] = {}  # a domain is INT16 where a module asking int16 touches its codes
        for op in range(graph.num_ops):
            node = graph.fx_op_node[op]
            spec = self._selection.spec_of(node)
            if spec is None or spec.precision != INT16:
                continue
            ports = [placement.plan.in_domain[p] for p in graph.op_in[op]
                     if placement.semantics.in_sem[p] == CODE]
            for d in ports + [placement.plan.value_domain[v] for v in graph.op_out[op]]:
                if d >= 0:
                    asked.setdefault(d, f"precision int16 ({self._selection.where(node)})")
        return assign(self.spec, groups, num_domains, asked)

    def _weight_precisions(self, int4: list[Int4Weight], bits: Mapping[int, int],
                           graph: PortGraph) -> list[WeightPrecision]:
        if self._chosen_weights is not None:
            return list(self._chosen_weights)
        if self.spec.weights == AUTO:  # INT8 until `choose_precision` runs the search
            return [WeightPrecision(w.op, w.name, BITS8, "auto: not searched yet") for w in int4]
        if not self._selection.selective:
            return assign_weights(self.spec, int4, bits)
        asked = {}
        for w in int4:
            spec = self._selection.spec_of(graph.fx_op_node[w.op])
            asked[w.op] = spec.weights if spec is not None else INT8
        return assign_weights(self.spec, int4, bits, asked)

    def _left_out(self, graph: PortGraph) -> list[int]:
        """The operators whose module selection is None (`set_global(None)`, ...)."""
        if not self._selection.selective:
            return []
        return [op for op in range(graph.num_ops) if self._selection.spec_of(graph.fx_op_node[op]) is None]

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None

    def prepare_obs_or_fq_callback(self, model: torch.fx.GraphModule,
                                   edge_or_node_to_obs_or_fq: dict[EdgeOrNode, Any]) -> None:
        # a port the replay annotates that the calibrated graph had none at (an INT16
        # domain's unfolded relu) shares its group's fresh observer: it gets the
        # calibrated one that replaces that observer at the group's other ports
        replaced: dict[int, Any] = {}
        if self._reuse is not None:
            for k, obs in edge_or_node_to_obs_or_fq.items():
                if _key(k) in self._reuse:
                    replaced[id(obs)] = self._reuse[_key(k)]
        for k in list(edge_or_node_to_obs_or_fq):
            key = _key(k)
            if self._reuse is not None:
                fresh = edge_or_node_to_obs_or_fq[k]
                edge_or_node_to_obs_or_fq[k] = self._reuse.get(key, replaced.get(id(fresh), fresh))
            self._observers[key] = edge_or_node_to_obs_or_fq[k]

    # ---- after calibration ------------------------------------------------
    @property
    def precisions(self) -> list[DomainPrecision]:
        """Each domain's activation width and why (after `choose_precision` at ``auto``)."""
        return list(self.annotation.precisions)

    @property
    def weight_precisions(self) -> list[WeightPrecision]:
        """Each weight's width that may be INT4, and why (after `choose_precision` at ``auto``)."""
        return list(self.annotation.weight_precisions)

    @property
    def int16_groups(self) -> Groups:
        """The domains that can be INT16, as groups sharing one precision."""
        return self.annotation.groups

    def choose_precision(self, prepared: torch.fx.GraphModule, data: Any, rounding_data: Any = None
                         ) -> list[DomainPrecision]:
        """At ``precision="auto"`` (or ``weights="auto"``): search each domain's (and
        weight's) width under the spec's budget on `data` (input tuples; the calibration
        data), then set it on `prepared`'s observers, so that ``convert_pt2e(prepared)``
        builds the mixed-precision program. At ``weight_rounding="gptq"``, first round
        the weights on `rounding_data` (`weight_rounding`; default `data`), whatever the
        widths. GPTQ fits the weights to the inputs it sees, so a search that scores on
        them scores optimistically: give it other inputs to keep its budget honest
        (docs/results/precision.md, "Rounding and search on separate data"). Call it between
        calibration and convert_pt2e; returns the domains' widths and why each was
        chosen (`weight_precisions`: the weights')."""
        a = self.annotation
        if not self.spec.after_calibration:
            raise ValueError(f"choose_precision: precision is {self.spec.precision!r}, weights "
                             f"{self.spec.weights!r} and weight_rounding {self.spec.weight_rounding!r}: "
                             "the widths are fixed at annotation and the rounding is nearest")
        if self.spec.weight_rounding == GPTQ:
            widths = (BITS8,) if self.spec.weights == INT8 else (BITS8, BITS4)
            fitted = data if rounding_data is None else rounding_data
            self.rounding_skipped = round_weights(prepared, list(fitted), widths)
        if not self.spec.searched:
            self.set_widths(prepared, {p.domain: p.bits for p in a.precisions},
                            {w.op: w.bits for w in a.weight_precisions})
            return list(a.precisions)
        result = search(self, prepared, data)
        self.search_result = result
        self._chosen, self._chosen_weights = result.precisions, result.weights
        a.precisions, a.weight_precisions = list(result.precisions), list(result.weights)
        self.set_widths(prepared, {p.domain: p.bits for p in result.precisions},
                        {w.op: w.bits for w in result.weights})
        if a.cut_ports:
            self._keep_cuts()
            result.precisions, result.weights = self.precisions, self.weight_precisions
        return list(result.precisions)

    def _keep_cuts(self) -> None:
        """After the search at split_chains: keep the chain cuts whose two sides it gave
        two widths. `set_widths` removed the others' observers; here the plan is laid
        out again without them. Domain ids change with it: a new domain is one old
        domain that is not a cut, with the cuts undone into it, or a kept cut, and it
        takes that old domain's width, why, observer and folded activations."""
        a = self.annotation
        old = a.placement.plan
        chosen = {p.domain: p for p in a.precisions}
        undone = set(undone_cuts(a.cuts, {d: p.bits for d, p in chosen.items()}))
        kept = tuple(p for p in a.cut_ports if old.in_domain[p] not in undone)
        for d in undone:
            self._observers.pop(a.roots[d], None)
        placement = self._place(a.graph, a.table, a.plain, kept)
        new = placement.plan
        was: dict[int, int] = {}  # new domain -> the old one it is
        for d in new.domains:
            olds = {old.in_domain[p] for p in d.in_ports} | {old.value_domain[x] for x in d.values}
            (was[d.id],) = olds - undone
        groups = int16_groups(a.graph, placement, a.table)
        self._chosen = [DomainPrecision(d, chosen[was[d]].bits, groups.blocked.get(d, chosen[was[d]].why))
                        for d in range(len(new.domains))]
        self._cuts = kept
        annotator = self._laid_out(a.graph, placement, a.table, a.arm, a.derived)
        bits = {p.domain: p.bits for p in annotator.precisions}
        narrow = self.spec.weights != INT8  # an INT16 input keeps the weight INT8 (as the search says)
        annotator.weight_precisions = [
            WeightPrecision(p.op, p.name, p.bits, kept_int8(w) if narrow and bits[w.input_domain] == BITS16 else p.why)
            for p, w in zip(annotator.weight_precisions, annotator.int4)]
        self._chosen_weights = list(annotator.weight_precisions)
        annotated = self._record(annotator, a.fp32, a.derived, a.plain, kept, a.weight_roots)
        annotated.roots = {d: a.roots[was[d]] for d in was}
        annotated.fused = {d: a.fused[was[d]] for d in was if was[d] in a.fused}
        self._annotated = annotated

    def set_widths(self, prepared: torch.fx.GraphModule, bits: Mapping[int, int],
                   weight_bits: Mapping[int, int] | None = None) -> None:
        """Give each domain's observer in `prepared` its width (and, given `weight_bits`,
        each weight's, by operator: the others keep theirs); where an INT16 domain's
        relu was annotated folded into its convolution, quantize between them (the
        module docstring: Arm's int16 lowering of the folded pair drops the relu)."""
        self._set_widths(prepared, self._observers, bits, weight_bits)

    def with_widths(self, prepared: torch.fx.GraphModule, bits: Mapping[int, int],
                    weight_bits: Mapping[int, int] | None = None) -> torch.fx.GraphModule:
        """A copy of calibrated `prepared` with these widths (`set_widths`), `prepared`
        and its observers untouched: what `convert_pt2e` of one candidate needs
        (`vela_cost`)."""
        # the observers' own tensors (the weight each saw, GPTQ's rounded weights) are
        # read, never written, by `_set_widths` and convert_pt2e: the copy shares them
        # (ResNet-18: two of the three copies of its weights a copy would otherwise make)
        memo: dict[int, Any] = {}
        for obs in self._observers.values():
            if isinstance(obs, WeightObserver):
                for t in (obs.weight, *obs.rounded.values()):
                    if t is not None:
                        memo[id(t)] = t
        copied = copy.deepcopy(prepared, memo)
        observers = {key: memo.get(id(obs), obs) for key, obs in self._observers.items()}
        self._set_widths(copied, observers, bits, weight_bits)
        return copied

    def _set_widths(self, prepared: torch.fx.GraphModule, observers: Mapping[Key, Any],
                    bits: Mapping[int, int], weight_bits: Mapping[int, int] | None) -> None:
        a = self.annotation
        for op, width in (weight_bits or {}).items():
            observers[a.weight_roots[op]].bits = width
        changed = False
        for d in undone_cuts(a.cuts, bits):  # a cut with one width on both sides: no transcode
            changed |= _drop_observer(prepared, observers[a.roots[d]])
        names = {id(m): name for name, m in prepared.named_modules()}
        nodes = {n.name: n for n in prepared.graph.nodes}
        for d, key in a.roots.items():
            observer = observers[key]
            observer.bits = bits.get(d, BITS8)
            if observer.bits != BITS16:
                continue
            for producer, activation in a.fused.get(d, ()):
                src, act = nodes[producer], nodes[activation]
                if src not in act.all_input_nodes:
                    continue  # quantized between them already
                with prepared.graph.inserting_after(src):
                    observed = prepared.graph.call_module(names[id(observer)], (src,))
                act.replace_input_with(src, observed)
                changed = True
        if changed:
            prepared.recompile()
        apply_rounded(prepared)  # each rounded weight as its width rounds it

    @property
    def derived_rows(self) -> tuple[str, ...]:
        """The operators whose integer row is Arm's annotation of them (no table row)."""
        return self.annotation.derived

    def thetas(self) -> dict[int, Theta]:
        """Each domain's theta, as its observer learned it from the calibration it saw."""
        a = self.annotation
        out: dict[int, Theta] = {}
        for d, key in a.roots.items():
            obs = self._observers.get(key)
            if obs is None:
                raise ValueError(f"CodecQuantizer: domain {d} has no observer; run prepare_pt2e first")
            out[d] = obs.theta()
        return out

    def fp32_module(self) -> torch.fx.GraphModule:
        """The FP32 graph as this quantizer annotated it (batch norms folded, Arm's
        decompositions applied): what the quantized module approximates."""
        return copy.deepcopy(self.annotation.fp32)

    def tag_external_weights(self, quantized: ExportedProgram) -> ExportedProgram:
        """The quantized program (`torch.export.export(convert_pt2e(prepared), ...)`), with
        its constants marked for a .ptd where the target reads marks on the program
        (XNNPACK's external constants), when the spec asks ``external_weights=True``;
        otherwise as it is. Call it between export and `to_edge_transform_and_lower`.
        Our delegate and Ethos-U take external weights from the partitioner's spec."""
        if self.spec.external_weights:
            target_of(self.spec.target).tag_external_weights(quantized)
        return quantized

    def converted(self) -> torch.fx.GraphModule:
        """The quantized module `convert_pt2e` makes of the calibrated model: the graph
        this quantizer annotated, prepared again with the calibrated observers, converted."""
        a = self.annotation
        replay = copy.copy(self)  # annotates the copy as this one did, with these observers
        replay._reuse, replay._observers = dict(self._observers), {}
        prepared = prepare_pt2e(copy.deepcopy(a.fp32), replay)
        apply_rounded(prepared)
        return convert_pt2e(prepared)

    def planned(self, quantized: ExportedProgram, partitioner: Partitioner,
                materialized: ExportedProgram | None = None) -> PlannedProgram:
        """The plan's record for the simulation: its materialised program is the edge
        program `partitioner` tags when `quantized` (the exported converted module)
        is lowered with it, decomposed exactly as that lowering decomposes it (given,
        when the caller decomposed it already: `decomposed_for`); its program, the
        FP32 graph this quantizer annotated, decomposed the same way."""
        a = self.annotation
        args, kwargs = quantized.example_inputs
        fp32 = edge_program(torch.export.export(self.fp32_module(), args, kwargs), partitioner)
        if materialized is None:
            materialized = edge_program(quantized, partitioner)
        return PlannedProgram(self.spec, a.graph, a.placement, self.thetas(), fp32, _materialized=materialized)

    @property
    def annotation(self) -> Annotation:
        """What `annotate` decided (`quantizer.annotation`)."""
        if self._annotated is None:
            raise ValueError("CodecQuantizer: nothing annotated yet; pass it to prepare_pt2e first")
        return self._annotated

    def observer(self, key: Key) -> Any:
        """PT2E's observer of an annotated edge or node (`Annotation.roots`, `weight_roots`)."""
        return self._observers[key]

    # ---- the table at this graph -----------------------------------------
    def _table(self, graph: PortGraph, arm: Mapping[str, QuantizationAnnotation]
               ) -> tuple[CommutationTable, tuple[str, ...]]:
        """The spec's table; at an integer-only policy plus a row per operator Arm's
        INT flow takes that the table has no integer row for, from Arm's annotation."""
        base = self.spec.commutation_table
        if not self.spec.integer_only:
            return base, ()
        rows = dict(base.rows)
        derived: list[str] = []
        for op in range(graph.num_ops):
            node, target = graph.fx_op_node[op], graph.op_target[op]
            if node is None or node.name not in arm or target in derived:
                continue
            row = base.lookup(target)
            if row is not None and row.policy is not None and base.order.selects(self.spec.policy, row.policy):
                continue
            derived_row = _derived_row(graph, op, arm[node.name], self.spec.policy)
            if derived_row is not None:
                rows[target] = derived_row
                derived.append(target)
        return CommutationTable(rows, base.order), tuple(derived)


def edge_program(program: ExportedProgram, partitioner: Partitioner) -> ExportedProgram:
    """`program` as `to_edge_transform_and_lower(program, [partitioner])` hands it to
    the partitioner (its pre-decomposition transforms and the operators it keeps
    whole), with nothing delegated and real constants."""
    return decomposed_for(program, partitioner).exported_program()


def decomposed_for(program: ExportedProgram, partitioner: Partitioner) -> Any:
    """`edge_program`'s EdgeProgramManager: its `.to_backend(partitioner)` is then
    the lowering `to_edge_transform_and_lower(program, [partitioner])` does, and
    its program before that call the plan's materialised program, decomposed once."""
    class Decomposing(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self.partitioned = False

        def transform_for_pre_decomposition(self, ep: ExportedProgram) -> ExportedProgram:
            return partitioner.transform_for_pre_decomposition(ep)

        def ops_to_not_decompose(self, ep: ExportedProgram) -> Any:
            ops, check = partitioner.ops_to_not_decompose(ep)
            if self.partitioned:
                # asked again after partitioning, to check that every kept operator was
                # delegated: none is here (XnnpackPartitioner keeps aten.linear whole)
                return ops, (lambda node: False)
            return ops, check

        def partition(self, ep: ExportedProgram) -> PartitionResult:
            self.partitioned = True
            return PartitionResult(tagged_exported_program=ep, partition_tags={})

    return to_edge_transform_and_lower(copy.deepcopy(program), partitioner=[Decomposing()])


def _derived_row(graph: PortGraph, op: int, ann: QuantizationAnnotation, policy: str) -> Row | None:
    """A row for an operator the table has no integer variant of, from how Arm's
    quantizer annotates it: the ports it quantizes are encoded, constants it
    quantizes are weights (their qspecs stay Arm's), and ports whose qspecs are
    shared with one another form one block (where's `other` shares `self`'s and
    the output's: the SELECT picks codes of one domain)."""
    node = graph.fx_op_node[op]
    by_node = {graph.fx_value_node[graph.in_value[p]]: p for p in graph.op_in[op]}
    encoded: list[str] = []
    weights: list[str] = []
    qspecs: dict[str, Any] = {}
    for arg, qspec in ann.input_qspec_map.items():
        p = by_node.get(arg)
        if p is None or qspec is None:
            continue
        name = graph.in_arg[p]
        encoded.append(name)
        qspecs[name] = qspec
        if graph.val_kind[graph.in_value[p]] == CONSTANT:
            weights.append(name)
    if ann.output_qspec is not None:
        encoded.append(OUT)
        qspecs[OUT] = ann.output_qspec
    if not encoded:
        return None

    def port(source: Any) -> Any:
        """What a SharedQuantizationSpec's source names: a port of this operator
        (an input's node, an edge into it, this operator's own output), or else the
        source itself (Arm's annotation propagates sharing from further upstream)."""
        if isinstance(source, tuple) and source[1] is node and source[0] in by_node:
            source = source[0]
        if source is node:
            return OUT
        p = by_node.get(source) if isinstance(source, torch.fx.Node) else None
        return graph.in_arg[p] if p is not None else source

    group: dict[Any, Any] = {name: name for name in encoded}

    def root(key: Any) -> Any:
        group.setdefault(key, key)
        while group[key] != key:
            key = group[key]
        return key

    for name, qspec in qspecs.items():
        if isinstance(qspec, SharedQuantizationSpec):
            group[root(name)] = root(port(qspec.edge_or_node))
    members: dict[Any, list[str]] = {}
    for name in dict.fromkeys(encoded):
        members.setdefault(root(name), []).append(name)
    blocks = tuple(tuple(m) for m in members.values() if len(m) > 1)
    # a constant that other ports share codes with (a `full` as where's `self`) is
    # coded as they are, not as a weight of its own
    shared = {name for b in blocks for name in b}
    return Row(graph.op_target[op], policy, tuple(dict.fromkeys(encoded)), blocks,
               tuple(w for w in dict.fromkeys(weights) if w not in shared),
               int16=graph.op_target[op] in INT16_DERIVED_TARGETS)


def _guards_kept(model: torch.fx.GraphModule,
                 transform: Callable[[torch.fx.GraphModule], torch.fx.GraphModule]) -> torch.fx.GraphModule:
    """`transform(model)` with torch.export's input guard set aside while it runs.

    ``torch.export.export(...).module()`` checks its inputs in a `_guards_fn`
    call_module, which ExportPass-based transforms (Arm's `DecomposeAvgPool2dPass`)
    refuse; stock Arm's quantizer fails there. The call is taken out, the graph
    transformed, and the call put back after the inputs it reads, so the prepared
    module still checks its inputs (dropped only if a transform renamed them)."""
    guards = [n for n in model.graph.nodes if n.op == "call_module" and not n.users]
    if not guards:
        return transform(model)
    kept = []
    for node in guards:
        kept.append((str(node.target), model.get_submodule(str(node.target)),
                     [a.name if isinstance(a, torch.fx.Node) else a for a in node.args]))
        model.graph.erase_node(node)
    model.recompile()
    result = transform(model)
    placeholders = {n.name: n for n in result.graph.nodes if n.op == "placeholder"}
    if not placeholders:
        return result
    for target, module, args in kept:
        if any(isinstance(a, str) and a not in placeholders for a in args):
            continue
        if not hasattr(result, target):
            result.add_submodule(target, module)
        with result.graph.inserting_after(list(placeholders.values())[-1]):
            result.graph.call_module(target, tuple(placeholders[a] if isinstance(a, str) else a for a in args))
    result.recompile()
    return result


def _constants_typed(model: torch.fx.GraphModule) -> None:
    """Give a constant (get_attr) node whose meta["val"] is missing or has a symbolic
    shape (some that Arm's annotation transforms create) a FakeTensor of the tensor it
    reads. Arm's quantizer checks operands' FakeTensors, so the others stay as they are."""
    mode: FakeTensorMode | None = None
    for node in model.graph.nodes:
        val = node.meta.get("val")
        if node.op != "get_attr" or (isinstance(val, torch.Tensor)
                                     and not any(isinstance(d, torch.SymInt) for d in val.shape)):
            continue
        value: Any = model
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor):
            mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
            node.meta["val"] = mode.from_tensor(value)


def _constants_detached(model: torch.fx.GraphModule) -> None:
    """Detach the constant tensors Arm's annotation transforms computed from
    parameters with autograd on (DeiT-tiny's attention): a tensor with a grad_fn
    cannot be deep-copied, and a constant needs no gradient."""
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                setattr(module, name, value.detach())
        for name, value in list(module._buffers.items()):
            if value is not None and value.grad_fn is not None:
                module._buffers[name] = value.detach()


def _key(edge_or_node: EdgeOrNode) -> Key:
    if isinstance(edge_or_node, tuple):
        return (edge_or_node[0].name, edge_or_node[1].name)
    return edge_or_node.name


def _program_input(where: EdgeOrNode) -> str | None:
    """The name of the program input an observer at `where` sees, or None."""
    node = where[0] if isinstance(where, tuple) else where
    return str(node.target) if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None


class _Annotator:
    """Writes the placement as PT2E annotations on the FX nodes (module docstring)."""

    def __init__(self, graph: PortGraph, placement: Placement, table: CommutationTable, spec: CodecSpec,
                 arm: Mapping[str, QuantizationAnnotation], derived: frozenset[str], target: Int8Flow,
                 bits: Mapping[int, int], weight_bits: Mapping[int, int]) -> None:
        self.g = graph
        self.placement = placement
        self.bits = bits  # each domain's code width
        self.weight_bits = weight_bits  # each INT4-capable operator's weight width
        self.weight_roots: dict[int, Key] = {}  # operator -> its weight observer's edge (written)
        self.target = target
        self.derived = derived  # targets whose rows (and constant qspecs) are Arm's
        self.sem = placement.semantics
        self.plan = placement.plan
        self.table = table
        self.spec = spec
        self.arm = arm
        self.fused = self._fused_activations()
        # what `CodecQuantizer._laid_out` decided with it, for `Annotation`
        self.groups = Groups((), {})
        self.precisions: list[DomainPrecision] = []
        self.int4: list[Int4Weight] = []
        self.weight_precisions: list[WeightPrecision] = []
        # each domain's QuantizationSpec sits at its first annotated port: PT2E creates a
        # sharing group's observer from the first member it visits (nodes in order, a
        # node's input edges before its output), and a SharedQuantizationSpec may only
        # name a member already visited. The group has one observer wherever it sits.
        self.root: dict[int, EdgeOrNode] = {}
        for d, where in self._positions():
            self.root.setdefault(d, where)

    def _positions(self) -> list[tuple[int, EdgeOrNode]]:
        """Every (domain, edge or node) to annotate, in the order PT2E visits them."""
        g, out = self.g, []
        for op in range(g.num_ops):
            node = g.fx_op_node[op]
            if node is None:
                continue
            for p in g.op_in[op]:
                arg = g.fx_value_node[g.in_value[p]]
                if arg is not None and p not in self.fused and self.sem.in_sem[p] == CODE:
                    out.append((self.plan.in_domain[p], (arg, node)))
            for v in g.op_out[op]:
                value_node = g.fx_value_node[v]
                if self.sem.out_code[v] and value_node is not None and v not in self.fused_values:
                    out.append((self.plan.value_domain[v], value_node))
        return out

    def write(self) -> dict[int, Key]:
        g = self.g
        annotations: dict[torch.fx.Node, QuantizationAnnotation] = {}

        def annotation(node: torch.fx.Node) -> QuantizationAnnotation:
            if node not in annotations:
                annotations[node] = QuantizationAnnotation(allow_implicit_sharing=False, _annotated=True)
            return annotations[node]

        for op in range(g.num_ops):
            node = g.fx_op_node[op]
            if node is None:
                continue
            row = self.table.lookup(g.op_target[op])
            weight_edges: dict[str, torch.fx.Node] = {}
            for p in g.op_in[op]:
                arg = g.fx_value_node[g.in_value[p]]
                if arg is None or p in self.fused:
                    continue
                if self.sem.in_sem[p] == CODE:
                    annotation(node).input_qspec_map[arg] = self._spec(self.plan.in_domain[p], (arg, node))
                elif self.sem.in_sem[p] == WEIGHT:
                    annotation(node).input_qspec_map[arg] = self._weight_spec(op, arg, row)
                    weight_edges[g.in_arg[p]] = arg
                    if op in self.weight_bits:
                        self.weight_roots[op] = _key((arg, node))
            self._bias(op, node, row, weight_edges, annotation)
            for v in g.op_out[op]:
                out = g.fx_value_node[v]
                if not self.sem.out_code[v] or out is None or v in self.fused_values:
                    continue
                annotation(out).output_qspec = self._spec(self.plan.value_domain[v], out)
                if out is not node:
                    annotation(node)  # a multi-output operator: its getitem carries the qspec
        for node, ann in annotations.items():
            node.meta[Q_ANNOTATION_KEY] = ann
            # Arm folds q/dq only into operators its quantizer marked quantized
            node.meta.setdefault("custom", {})[ARM_ANNOTATION_KEY] = {"quantized": True}
        return {d: _key(e) for d, e in self.root.items()}

    # ---- domains ----------------------------------------------------------
    def _spec(self, d: int, here: EdgeOrNode) -> QuantizationSpecBase:
        root = self.root[d]
        if _key(here) != _key(root):
            return SharedQuantizationSpec(root)
        domain = self.plan.domains[d]
        # a folded activation's range keeps its lowest code for 0.0 (targets.base.Int8Flow)
        symmetric = self.spec.symmetric_activations and not (
            self.target.fold_needs_lowest_zero_point and d in self.fused_domains)
        bits = self.bits.get(d, BITS8)
        observer = DomainObserver.with_args(
            observer=self.spec.observer, symmetric=symmetric, clip=self._clip(domain), bits=bits,
            label=f"{d} (dominator {' + '.join(domain.dominators)})", graph_input=_program_input(root))
        if bits == BITS16:
            return QuantizationSpec(dtype=torch.int16, observer_or_fake_quant_ctr=observer, quant_min=QMIN16,
                                    quant_max=QMAX16, qscheme=torch.per_tensor_symmetric)
        return QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=observer, quant_min=_QMIN,
                                quant_max=_QMAX, qscheme=torch.per_tensor_affine)

    def _clip(self, d: Domain) -> tuple[float, float] | None:
        """The bounds of the clamps the plan learns `d`'s theta after, when it has
        one dominator (placement/plan.py): every port of `d` upstream of them is
        observed clipped to what they let through."""
        if d.shared:
            return None
        g, x = self.g, d.observe
        lo, hi = -math.inf, math.inf
        clamped = False
        while g.val_op[x] >= 0 and g.op_target[g.val_op[x]] in CLAMPING_TARGETS:
            op = g.val_op[x]
            port = g.op_in[op][0]
            if self.plan.in_domain[port] != d.id:
                break
            a, b = _clamp_bounds(g, op)
            lo, hi, clamped = max(lo, a), min(hi, b), True
            x = g.in_value[port]
        return (lo, hi) if clamped else None

    # ---- fused activations -------------------------------------------------
    def _fused_activations(self) -> set[int]:
        """In-ports of relu/relu6 right after a convolution or linear whose output only
        they read, in one domain: left unannotated, as Arm annotates the pair (its
        FuseQuantizedActivationPass then folds the activation into the RESCALE).
        `fused_values` gets the producers' outputs."""
        g = self.g
        candidates: dict[int, list[tuple[int, int]]] = {}  # domain -> (activation in-port, producer output)
        for op in range(g.num_ops):
            if g.op_target[op] not in CLAMPING_TARGETS:
                continue
            p = g.op_in[op][0]
            x = g.in_value[p]
            producer = g.val_op[x]
            if producer < 0 or len(g.val_uses[x]) != 1 or self.sem.in_sem[p] != CODE:
                continue
            out = g.op_out[op][0]
            d = self.plan.in_domain[p]
            if not self.target.fuses(g, producer, op, self.table) or self.plan.value_domain[x] != d \
                    or self.plan.value_domain[out] != d or self.bits.get(d, BITS8) != BITS8:
                continue
            candidates.setdefault(d, []).append((p, x))
        ports: set[int] = set()
        self.fused_values: set[int] = set()
        self.fused_domains: set[int] = set()
        for d, pairs in candidates.items():
            # Arm's fold saturates at the lowest code, which is 0.0 only where the
            # domain holds no negative value (targets.base.Int8Flow)
            if self.target.fold_needs_lowest_zero_point and not self._non_negative(
                    d, {p for p, _ in pairs}, {x for _, x in pairs}):
                continue
            ports.update(p for p, _ in pairs)
            self.fused_values.update(x for _, x in pairs)
            self.fused_domains.add(d)
        return ports

    def _non_negative(self, d: int, skip_ports: set[int], skip_values: set[int]) -> bool:
        """Whether every value domain `d`'s observer sees is >= 0 by construction (a
        relu-like clamp from 0, or codes moved from such values), leaving out the
        folded pairs' pre-activation values, which no observer sees."""
        g, domain = self.g, self.plan.domains[d]
        known: dict[int, bool] = {}

        def value(v: int) -> bool:
            if v not in known:
                known[v] = False  # a cycle is not a proof
                op = g.val_op[v]
                if op >= 0 and g.op_target[op] in CLAMPING_TARGETS:
                    known[v] = _clamp_bounds(g, op)[0] >= 0.0
                elif op >= 0:
                    row = self.table.lookup(g.op_target[op])
                    pads_below_zero = (g.op_target[op].startswith("aten.constant_pad_nd")
                                       and float(g.op_argument(op, "value") or 0.0) < 0.0)
                    known[v] = (row is not None and row.moves_codes and not pads_below_zero
                                and bool(g.op_in[op]) and all(value(g.in_value[p]) for p in g.op_in[op]))
            return known[v]

        seen = [g.in_value[p] for p in domain.in_ports if p not in skip_ports]
        seen += [v for v in domain.values if v not in skip_values]
        return all(value(v) for v in seen)

    def fused_pairs(self) -> dict[int, list[tuple[str, str]]]:
        """Per domain, the (producer, activation) node names annotated folded."""
        g, out = self.g, {}
        for p in self.fused:
            op = g.in_op[p]
            producer = g.fx_value_node[g.in_value[p]]
            activation = g.fx_op_node[op]
            if producer is not None and activation is not None:
                out.setdefault(self.plan.in_domain[p], []).append((producer.name, activation.name))
        return out

    # ---- weights and biases -------------------------------------------------
    def _weight_spec(self, op: int, arg: torch.fx.Node, row: Row | None) -> QuantizationSpecBase:
        node = self.g.fx_op_node[op]
        assert row is not None and node is not None
        if row.target in self.derived:
            # an operator whose row comes from Arm's annotation keeps Arm's weight qspec
            return self.arm[node.name].input_qspec_map[arg]
        axis = row.weight_axis
        bits = self.weight_bits.get(op, BITS8)
        qmin, qmax = weight_range(bits)
        return QuantizationSpec(
            dtype=torch.int8, observer_or_fake_quant_ctr=WeightObserver.with_args(
                ch_axis=axis, bits=bits, label=self.g.op_name[op]),
            quant_min=qmin, quant_max=qmax,
            qscheme=torch.per_channel_symmetric if axis is not None else torch.per_tensor_symmetric,
            ch_axis=axis)

    def _bias(self, op: int, node: torch.fx.Node, row: Row | None, weights: dict[str, torch.fx.Node],
              annotation: Any) -> None:
        """The int32 bias codes at s_in * s_w of an operator with an encoded weight."""
        g = self.g
        if not self.target.bias_codes:
            return  # the target quantizes an FP32 bias itself (XNNPACK)
        if row is None or row.bias is None or row.bias_scale_of is None or len(weights) != 1:
            return
        if row.target in self.derived:
            kept = self.arm.get(node.name)
            for arg, qspec in (kept.input_qspec_map.items() if kept else ()):
                if isinstance(qspec, DerivedQuantizationSpec):
                    annotation(node).input_qspec_map[arg] = qspec
            return
        bias = next((p for p in g.op_in[op] if g.in_arg[p] == row.bias), None)
        act = next((p for p in g.op_in[op] if g.in_arg[p] == row.bias_scale_of), None)
        if bias is None or act is None or self.sem.in_sem[act] != CODE:
            return
        bias_node = g.fx_value_node[g.in_value[bias]]
        act_node = g.fx_value_node[g.in_value[act]]
        (weight_node,) = weights.values()
        annotation(node).input_qspec_map[bias_node] = DerivedQuantizationSpec(
            derived_from=[(act_node, node), (weight_node, node)], derive_qparams_fn=bias_qparams,
            dtype=torch.int32, quant_min=INT32_QMIN, quant_max=INT32_QMAX,
            qscheme=torch.per_channel_symmetric, ch_axis=0)


def _drop_observer(prepared: torch.fx.GraphModule, dropped: Any) -> bool:
    """Take an undone cut's observer `dropped` out of `prepared` (False: it is gone
    already). At the cut's edge its readers read its input, the observer of the domain
    the cut read; its other ports (an average pool's output) and the derived observers
    that named it (a bias's int32 codes are at input scale x weight scale: left at the
    cut's, Arm's RESCALE, which takes the input's, would misread them) take that
    observer instead. PT2E registers a shared observer under one name per port, so the
    calls are found by instance."""
    modules = dict(prepared.named_modules(remove_duplicate=False))
    calls = [n for n in prepared.graph.nodes if n.op == "call_module" and modules.get(str(n.target)) is dropped]
    if not calls:
        return False
    edges = [n for n in calls if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "call_module"]
    if not edges:
        raise AssertionError(f"split_chains: the cut observer {calls[0].target} does not read an observer")
    source_name = str(edges[0].args[0].target)
    source = modules[source_name]
    for node in calls:
        if node in edges:
            node.replace_all_uses_with(node.args[0])
            prepared.graph.erase_node(node)
        else:
            node.target = source_name
    for module in prepared.modules():
        shared = getattr(module, "obs_or_fqs", None)  # torchao's DerivedObserverOrFakeQuantize
        if isinstance(shared, list) and any(o is dropped for o in shared):
            module.obs_or_fqs = [source if o is dropped else o for o in shared]
    for name in [k for k, m in modules.items() if m is dropped]:
        prepared.delete_submodule(name)
    return True


def _clamp_bounds(graph: PortGraph, op: int) -> tuple[float, float]:
    target = graph.op_target[op]
    if target.startswith("aten.relu6"):
        return 0.0, 6.0
    if target.startswith("aten.relu"):
        return 0.0, math.inf
    if target.startswith("aten.hardtanh"):
        return float(graph.op_argument(op, "min_val")), float(graph.op_argument(op, "max_val"))
    lo, hi = graph.op_argument(op, "min"), graph.op_argument(op, "max")
    return (-math.inf if lo is None else float(lo)), (math.inf if hi is None else float(hi))


__all__ = ["CodecQuantizer"]
