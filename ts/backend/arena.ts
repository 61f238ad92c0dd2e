// Host memory planned once per context. Regions are carved from large ArrayBuffers whose native
// address is taken once (large buffers are never moved by the JS engine, unlike small typed
// arrays), so hot-path calls pass plain addresses and nothing is allocated per token.
import { addressOf, offsetAddress, type Pointer } from "../native/lib.ts";

const BLOCK_BYTES = 16 << 20;
const ALIGN = 64;

export interface Region {
  readonly bytes: Uint8Array;
  readonly address: Pointer;
}

export class Arena {
  private blocks: { bytes: Uint8Array; address: Pointer; used: number }[] = [];
  bytesReserved = 0;

  alloc(byteLength: number): Region {
    const size = Math.ceil(Math.max(byteLength, 1) / ALIGN) * ALIGN;
    let block = this.blocks.find((b) => b.bytes.length - b.used >= size);
    if (!block) {
      const bytes = new Uint8Array(new ArrayBuffer(Math.max(BLOCK_BYTES, size + ALIGN)));
      const address = addressOf(bytes);
      const pad = (ALIGN - ((address as number) % ALIGN)) % ALIGN;
      block = { bytes, address, used: pad };
      this.blocks.push(block);
      this.bytesReserved += bytes.length;
    }
    const start = block.used;
    block.used += size;
    return { bytes: block.bytes.subarray(start, start + byteLength), address: offsetAddress(block.address, start) };
  }
}
