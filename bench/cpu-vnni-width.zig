// How many u8 x i8 dot-of-four instructions (vpdpbusd) this CPU retires a nanosecond on 256-bit
// and on 512-bit registers: 8 independent chains, 200 M instructions each way, three rounds. Equal
// multiply-adds a second on both widths means 512-bit ops are double-pumped (as on Zen 4) and
// widening the x8 matvec kernels to zmm would not add throughput (bench/results/cpu.md).
//   python3 -m ziglang run -OReleaseFast -mcpu=x86_64_v4+avx512vnni bench/cpu-vnni-width.zig
const std = @import("std");
/// The loop's text for registers named `r` ("ymm" or "zmm"): 8 zeroed accumulators, then 8
/// independent vpdpbusd a round.
fn loopAsm(comptime r: []const u8) []const u8 {
    comptime var text: []const u8 = "";
    inline for (0..8) |i| text = text ++ std.fmt.comptimePrint(" vpxord %%{s}{d}, %%{s}{d}, %%{s}{d}\n", .{ r, i, r, i, r, i });
    text = text ++ "1:\n";
    inline for (0..8) |i| text = text ++ std.fmt.comptimePrint(" vpdpbusd %%{s}8, %%{s}9, %%{s}{d}\n", .{ r, r, r, i });
    return text ++ " dec %[n]\n jnz 1b\n";
}

fn run(comptime zmm: bool) u64 {
    var iters: usize = 200_000_000 / 8;
    std.mem.doNotOptimizeAway(&iters);
    var t = std.time.Timer.start() catch unreachable;
    if (zmm) {
        asm volatile (loopAsm("zmm")
            : [n] "+r" (iters),
            :
            : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "cc"
        );
    } else {
        asm volatile (loopAsm("ymm")
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
