// Gemma 3n's AltUp ops on the CPU (Backend.altup): one native call over whole rows each
// (lib/cpu/altup.zig; the values' norm is infer_rms_norm without a weight). The streams of a
// prediction or correction reach the library as a table of their addresses, built once per list
// of streams (the model plans its lists once).
import { InferError } from "../errors.ts";
import { packed } from "../native/abi.ts";
import { check, native, type Pointer } from "../native/lib.ts";
import type { Activation, AltUpOps, Weight } from "./backend.ts";

/** What the ops need of the CPU backend's activations and weights. */
export interface CpuAltUpAccess {
  address(x: Activation): Pointer;
  /** The address of an F32 vector of `n` values; throws naming the tensor otherwise. */
  vector(w: Weight, n: number): Pointer;
}

export function cpuAltUpOps(access: CpuAltUpAccess): AltUpOps {
  const lib = native(), at = access.address;
  const tables = new WeakMap<readonly Activation[], BigUint64Array>();
  const table = (streams: readonly Activation[]) => {
    let t = tables.get(streams);
    if (!t) tables.set(streams, t = BigUint64Array.from(streams, (s) => BigInt(at(s))));
    return t;
  };
  const sameWidth = (streams: readonly Activation[], cols: number, what: string) => {
    if (streams.some((s) => s.cols !== cols)) {
      throw new InferError("internal", `AltUp ${what}: streams of different widths`);
    }
  };
  return {
    copyColumns(src, first, rows, dst) {
      check(lib.infer_copy_columns(at(src), src.cols, first, rows, at(dst), dst.cols),
        "copy_columns");
    },

    tanh(x, rows) {
      check(lib.infer_tanh(at(x), rows * x.cols), "tanh");
    },

    mulWeight(x, weight, rows) {
      check(lib.infer_mul_rows(at(x), access.vector(weight, x.cols), rows, x.cols), "mul_rows");
    },

    // As ggml_rms_norm on the values, without a weight.
    rmsNormHeads(x, rows, heads, eps) {
      check(lib.infer_rms_norm(at(x), null, rows * heads, x.cols / heads, eps, at(x)), "rms_norm");
    },

    matchMagnitude(x, target, rows, floor) {
      if (target.cols !== x.cols) throw new InferError("internal", "matchMagnitude: widths differ");
      check(lib.infer_match_magnitude(at(x), at(target), rows, x.cols, floor), "match_magnitude");
    },

    gaussianTopK(x, rows, multiplier) {
      check(lib.infer_gaussian_top_k(at(x), rows, x.cols, multiplier), "gaussian_top_k");
    },

    predict(x, coefs, rows, out) {
      const k = x.length, n = x[0].cols;
      if (coefs.cols !== k * k || out.length !== k) {
        throw new InferError("internal",
          `AltUp prediction of ${k} streams with ${coefs.cols} coefficients`);
      }
      sameWidth([...x, ...out], n, "prediction");
      const shape = packed("AltUpShape", { n_streams: k, n_rows: rows, n_cols: n });
      check(lib.infer_altup_predict(table(x), at(coefs), table(out), shape), "altup_predict");
    },

    correct(predictions, activated, coefs, active, rows, out) {
      const k = predictions.length, n = activated.cols;
      if (coefs.cols !== k || out.length !== k || !(active >= 0 && active < k)) {
        throw new InferError("internal",
          `AltUp correction of ${k} streams with ${coefs.cols} coefficients`);
      }
      sameWidth([...predictions, ...out], n, "correction");
      const shape = packed("AltUpShape", { n_streams: k, n_rows: rows, n_cols: n, active });
      check(lib.infer_altup_correct(table(predictions), at(activated), at(coefs), table(out),
        shape), "altup_correct");
    },
  };
}
