// How many u8 x i8 dot-of-four instructions (vpdpbusd) this CPU retires a nanosecond on 256-bit
// and on 512-bit registers: 8 independent chains, 200 M instructions each way, three rounds. Equal
// multiply-adds a second on both widths means 512-bit ops are double-pumped (as on Zen 4) and
// widening the x8 matvec kernels to zmm would not add throughput (bench/RESULTS.md).
//   python3 -m ziglang run -OReleaseFast -mcpu=x86_64_v4+avx512vnni bench/cpu-vnni-width.zig
const std = @import("std");
fn run(comptime zmm: bool) u64 {
    var iters: usize = 200_000_000 / 8;
    std.mem.doNotOptimizeAway(&iters);
    var t = std.time.Timer.start() catch unreachable;
    if (zmm) {
        asm volatile (
            \\ vpxord %%zmm0, %%zmm0, %%zmm0
            \\ vpxord %%zmm1, %%zmm1, %%zmm1
            \\ vpxord %%zmm2, %%zmm2, %%zmm2
            \\ vpxord %%zmm3, %%zmm3, %%zmm3
            \\ vpxord %%zmm4, %%zmm4, %%zmm4
            \\ vpxord %%zmm5, %%zmm5, %%zmm5
            \\ vpxord %%zmm6, %%zmm6, %%zmm6
            \\ vpxord %%zmm7, %%zmm7, %%zmm7
            \\ 1:
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm0
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm1
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm2
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm3
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm4
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm5
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm6
            \\ vpdpbusd %%zmm8, %%zmm9, %%zmm7
            \\ dec %[n]
            \\ jnz 1b
            : [n] "+r" (iters),
            :
            : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "cc"
        );
    } else {
        asm volatile (
            \\ vpxor %%ymm0, %%ymm0, %%ymm0
            \\ vpxor %%ymm1, %%ymm1, %%ymm1
            \\ vpxor %%ymm2, %%ymm2, %%ymm2
            \\ vpxor %%ymm3, %%ymm3, %%ymm3
            \\ vpxor %%ymm4, %%ymm4, %%ymm4
            \\ vpxor %%ymm5, %%ymm5, %%ymm5
            \\ vpxor %%ymm6, %%ymm6, %%ymm6
            \\ vpxor %%ymm7, %%ymm7, %%ymm7
            \\ 1:
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm0
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm1
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm2
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm3
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm4
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm5
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm6
            \\ vpdpbusd %%ymm8, %%ymm9, %%ymm7
            \\ dec %[n]
            \\ jnz 1b
            : [n] "+r" (iters),
            :
            : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "cc"
        );
    }
    return t.read();
}
pub fn main() void {
    for (0..3) |_| {
        const y = run(false);
        const z = run(true);
        std.debug.print("200M vpdpbusd: ymm {d} ms ({d:.2} per ns), zmm {d} ms ({d:.2} per ns)\n", .{ y / 1_000_000, 200_000_000.0 / @as(f64, @floatFromInt(y)), z / 1_000_000, 200_000_000.0 / @as(f64, @floatFromInt(z)) });
    }
}
