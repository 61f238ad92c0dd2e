// Gemma 3n's AltUp ops on the CPU (Backend.altup): loops over the activations' f32 rows in
// TypeScript, each sum in f64 and each stored value rounded once to f32. They touch a few values
// per hidden value (the dense matmuls around them dominate), so no native kernel is needed yet.
import { InferError } from "../errors.ts";
import type { Activation, AltUpOps, Weight } from "./backend.ts";

const f = Math.fround;

export function cpuAltUpOps(rowsOf: (x: Activation) => Float32Array,
  vectorOf: (w: Weight) => Float32Array): AltUpOps {
  const streams = (xs: readonly Activation[]) => xs.map(rowsOf);
  return {
    copyColumns(src, first, rows, dst) {
      if (first < 0 || first + dst.cols > src.cols) {
        throw new InferError("internal", `columns ${first}..${first + dst.cols} of ${src.cols}`);
      }
      const from = rowsOf(src), to = rowsOf(dst), n = dst.cols;
      for (let r = 0; r < rows; r++) {
        const s = r * src.cols + first;
        to.set(from.subarray(s, s + n), r * n);
      }
    },

    tanh(x, rows) {
      const v = rowsOf(x), n = rows * x.cols;
      for (let i = 0; i < n; i++) v[i] = Math.tanh(v[i]);
    },

    mulWeight(x, weight, rows) {
      const v = rowsOf(x), w = vectorOf(weight), n = x.cols;
      if (w.length !== n) throw new InferError("bad_model", `'${weight.name}' is not ${n} f32 values`);
      for (let r = 0; r < rows; r++) {
        for (let j = 0, o = r * n; j < n; j++) v[o + j] *= w[j];
      }
    },

    // As ggml_rms_norm: the sum of squares in double, the scale 1/sqrt(mean + eps) in f32.
    rmsNormHeads(x, rows, heads, eps) {
      const v = rowsOf(x), d = x.cols / heads;
      for (let h = 0; h < rows * heads; h++) {
        const o = h * d;
        let sum = 0;
        for (let j = 0; j < d; j++) sum += v[o + j] * v[o + j];
        const scale = f(1 / f(Math.sqrt(f(f(sum / d) + eps))));
        for (let j = 0; j < d; j++) v[o + j] *= scale;
      }
    },

    matchMagnitude(x, target, rows, floor) {
      const v = rowsOf(x), t = rowsOf(target), n = x.cols;
      if (target.cols !== n) throw new InferError("internal", "matchMagnitude: widths differ");
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        let have = 0, want = 0;
        for (let j = 0; j < n; j++) {
          have += v[o + j] * v[o + j];
          want += t[o + j] * t[o + j];
        }
        const scale = Math.sqrt(want / n) / Math.sqrt(Math.max(have / n, floor));
        for (let j = 0; j < n; j++) v[o + j] *= scale;
      }
    },

    gaussianTopK(x, rows, multiplier) {
      const v = rowsOf(x), n = x.cols;
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        let sum = 0;
        for (let j = 0; j < n; j++) sum += v[o + j];
        const mean = sum / n;
        let squares = 0;
        for (let j = 0; j < n; j++) squares += (v[o + j] - mean) ** 2;
        const cutoff = f(mean + Math.sqrt(squares / n) * multiplier);
        for (let j = 0; j < n; j++) v[o + j] = Math.max(0, f(v[o + j] - cutoff));
      }
    },

    predict(x, coefs, rows, out) {
      const k = x.length, xs = streams(x), os = streams(out), c = rowsOf(coefs), n = x[0].cols;
      if (coefs.cols !== k * k || out.length !== k) {
        throw new InferError("internal", `AltUp prediction of ${k} streams with ${coefs.cols} coefficients`);
      }
      for (let r = 0; r < rows; r++) {
        const o = r * n, co = r * k * k;
        for (let i = 0; i < k; i++) {
          const dst = os[i];
          for (let j = 0; j < n; j++) {
            let sum = 0;
            for (let s = 0; s < k; s++) sum += c[co + i * k + s] * xs[s][o + j];
            dst[o + j] = f(xs[i][o + j] + f(sum));
          }
        }
      }
    },

    correct(predictions, activated, coefs, active, rows, out) {
      const k = predictions.length, ps = streams(predictions), os = streams(out);
      const a = rowsOf(activated), c = rowsOf(coefs), n = activated.cols;
      if (coefs.cols !== k || out.length !== k || !(active >= 0 && active < k)) {
        throw new InferError("internal", `AltUp correction of ${k} streams with ${coefs.cols} coefficients`);
      }
      const scale = new Float64Array(k);
      for (let r = 0; r < rows; r++) {
        const o = r * n;
        for (let i = 0; i < k; i++) scale[i] = f(c[r * k + i] + 1);
        for (let j = 0; j < n; j++) {
          const innovation = f(a[o + j] - ps[active][o + j]);
          for (let i = 0; i < k; i++) os[i][o + j] = f(ps[i][o + j] + f(scale[i] * innovation));
        }
      }
    },
  };
}
