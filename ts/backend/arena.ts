// Host memory planned once per context. Regions are carved from large blocks whose native
// address is taken once (large buffers are never moved by the JS engine, unlike small typed
// arrays), so hot-path calls pass plain addresses and nothing is allocated per token.
//
// An arena of weights streamed every token takes its blocks from the library in huge pages
// (lib/pages.zig): decode of the Qwen3-0.6B-shape Q4_0 file ran 15% faster. Caches and
// activations stay in ordinary pages: in huge pages the K and V rows of every layer, carved at
// power-of-two offsets, fall into the same cache sets, and decode at 1,000 tokens of context ran
// 20% slower. free() returns every block; the regions must not be used after it.
import { InferError } from "../errors.ts";
import { addressOf, allocPages, offsetAddress, type PageRegion, type Pointer } from "../native/lib.ts";

const BLOCK_BYTES = 16 << 20;
const ALIGN = 64;

export interface Region {
  readonly bytes: Uint8Array;
  readonly address: Pointer;
}

interface Block { bytes: Uint8Array; address: Pointer; used: number; region: PageRegion | null }

export class Arena {
  private blocks: Block[] = [];
  bytesReserved = 0;

  /** Regions larger than a block get one of their own. */
  constructor(private readonly o: { blockBytes?: number; hugePages?: boolean } = {}) {}

  alloc(byteLength: number): Region {
    const size = Math.ceil(Math.max(byteLength, 1) / ALIGN) * ALIGN;
    let block = this.blocks.find((b) => b.bytes.length - b.used >= size);
    if (!block) {
      block = this.newBlock(Math.max(this.o.blockBytes ?? BLOCK_BYTES, size));
      this.blocks.push(block);
      this.bytesReserved += block.bytes.length;
    }
    const start = block.used;
    block.used += size;
    return { bytes: block.bytes.subarray(start, start + byteLength), address: offsetAddress(block.address, start) };
  }

  private newBlock(size: number): Block {
    if (this.o.hugePages) { // 2 MiB-aligned
      const region = allocPages(size);
      return { bytes: region.bytes, address: region.address, used: 0, region };
    }
    let bytes: Uint8Array;
    try {
      bytes = new Uint8Array(new ArrayBuffer(size + ALIGN));
    } catch (err) { // JavaScriptCore's "RangeError: Out of memory"
      if (!(err instanceof RangeError)) throw err;
      throw new InferError("out_of_memory", `cannot allocate ${size} bytes of buffers ` +
        `(${this.bytesReserved} reserved already): try a smaller --ctx-size`);
    }
    const address = addressOf(bytes);
    const pad = (ALIGN - ((address as number) % ALIGN)) % ALIGN;
    return { bytes, address, used: pad, region: null };
  }

  /** Returns the library's blocks now (ordinary ones go with the garbage collector). */
  free(): void {
    for (const b of this.blocks) b.region?.free();
    this.blocks = [];
    this.bytesReserved = 0;
  }
}
