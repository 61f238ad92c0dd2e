// A CPU stand-in for a GPU backend's greedy decoding on the device (argmaxToken, keepTokens,
// takeToken, dropTokens), so that the scheduler's device-greedy path runs where there is no GPU:
// the argmax is the sampler's, over the CPU logits, and tokens wait in a queue as the CUDA
// backend's do. Using it as the CUDA backend may not be used fails loudly: taking a token never
// queued, more than two in flight, or keeping device ids that a host upload replaced.
import type { Activation, Backend, DeviceGreedy } from "../../ts/backend/backend.ts";
import { argmax } from "../../ts/sample/sampler.ts";

export interface DeviceGreedyCounts {
  /** Steps that ended with the argmax on the "device". */
  argmax: number;
  /** Steps whose token was the previous step's argmax (keepTokens). */
  kept: number;
  taken: number;
  dropped: number;
}

/** Gives `be` (a CPU backend, the model's own instance) the device-greedy calls. */
export function withDeviceGreedy(be: Backend): DeviceGreedyCounts {
  const counts: DeviceGreedyCounts = { argmax: 0, kept: 0, taken: 0, dropped: 0 };
  const queue: number[] = [];
  let onDevice: Activation | null = null; // the ids an argmax wrote, until a host upload
  const upload = be.setTokens.bind(be);
  Object.assign(be, {
    setTokens(dst: Activation, ids: ArrayLike<number>, count: number): void {
      if (dst === onDevice) onDevice = null;
      upload(dst, ids, count);
    },
  });
  const deviceGreedy: DeviceGreedy = {
    argmaxToken(logits: Activation, ids: Activation): void {
      if (queue.length >= 2) throw new Error("a third greedy token queued");
      const token = argmax(be.read(logits, 1));
      upload(ids, [token], 1);
      onDevice = ids;
      queue.push(token);
      counts.argmax++;
    },
    keepTokens(dst: Activation, count: number): void {
      if (dst !== onDevice || count !== 1) throw new Error("keepTokens with no argmax in the ids");
      counts.kept++;
    },
    takeToken(): number {
      const token = queue.shift();
      if (token === undefined) throw new Error("takeToken with no token queued");
      counts.taken++;
      return token;
    },
    dropTokens(): void {
      counts.dropped += queue.length;
      queue.length = 0;
    },
  };
  Object.assign(be, { deviceGreedy });
  return counts;
}
