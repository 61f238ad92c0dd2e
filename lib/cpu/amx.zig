//! Intel AMX (Advanced Matrix Extensions): eight tile registers of up to 16 rows x 64 bytes and
//! a tile multiply, tdpbssd, that adds to each i32 of C[m][n] the i8 products
//! sum_k A[m][4k + i] * B[k][4n + i] (A: M rows of K bytes; B: K/4 rows of N i8 quads, the
//! "VNNI" layout). One tdpbssd of 16 x 16 x 64 is 16,384 multiply-adds: the prompt matmuls of
//! matmul_amx.zig run their integer block sums on it.
//!
//! Two implementations of the same tile operations: `Hardware` (the instructions, through inline
//! assembly: the assembler knows them whatever the target's features, and only CPUs that report
//! AMX reach them) and `Emulated` (scalar loops over eight tile buffers, honouring the configured
//! rows and bytes, with the same i32 accumulation), so the kernels are proven on any CPU and a
//! machine with AMX only confirms the instructions.
//!
//! Linux hands a process AMX's 8 KiB of tile state only on request
//! (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); without it the first tile instruction
//! faults. `available` asks once, after CPUID says the CPU has AMX-TILE and AMX-INT8.
const std = @import("std");
const builtin = @import("builtin");
const simd = @import("../quant/simd.zig");

/// Whether this build can run the AMX path at all: x86-64 Linux, and the AVX-512 build (every CPU
/// with AMX has AVX-512, which the kernels' float epilogues use).
pub const compiled = builtin.cpu.arch == .x86_64 and builtin.os.tag == .linux and simd.has_vnni;

pub const rows_max = 16;
pub const colsb_max = 64;

/// The 64-byte operand of ldtilecfg (palette 1): bytes per row and rows for each tile.
pub const Config = extern struct {
    palette: u8 = 1,
    start_row: u8 = 0,
    reserved: [14]u8 = @splat(0),
    colsb: [16]u16 = @splat(0),
    rows: [16]u8 = @splat(0),

    pub fn set(c: *Config, tile: u3, rows: u8, colsb: u16) void {
        std.debug.assert(rows <= rows_max and colsb <= colsb_max and colsb % 4 == 0);
        c.colsb[tile] = colsb;
        c.rows[tile] = rows;
    }
};
comptime {
    std.debug.assert(@sizeOf(Config) == 64);
}

const ARCH_REQ_XCOMP_PERM = 0x1023;
const XFEATURE_XTILEDATA = 18;

var state = std.atomic.Value(u8).init(0); // 0 unknown, 1 available, 2 not

/// CPUID leaf 7 says AMX-TILE and AMX-INT8 and the kernel grants this process the tile data.
pub fn available() bool {
    if (comptime !compiled) return false;
    switch (state.load(.acquire)) {
        1 => return true,
        2 => return false,
        else => {},
    }
    const ok = detect();
    state.store(if (ok) 1 else 2, .release);
    return ok;
}

fn detect() bool {
    const leaf0 = cpuid(0, 0);
    if (leaf0.eax < 7) return false;
    const leaf7 = cpuid(7, 0);
    const amx_tile = leaf7.edx >> 24 & 1 == 1;
    const amx_int8 = leaf7.edx >> 25 & 1 == 1;
    if (!amx_tile or !amx_int8) return false;
    const rc = std.os.linux.syscall2(.arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    return std.os.linux.E.init(rc) == .SUCCESS;
}

const CpuidResult = struct { eax: u32, ebx: u32, ecx: u32, edx: u32 };

fn cpuid(leaf: u32, subleaf: u32) CpuidResult {
    var eax: u32 = undefined;
    var ebx: u32 = undefined;
    var ecx: u32 = undefined;
    var edx: u32 = undefined;
    asm volatile ("cpuid"
        : [a] "={eax}" (eax),
          [b] "={ebx}" (ebx),
          [c] "={ecx}" (ecx),
          [d] "={edx}" (edx),
        : [leaf] "{eax}" (leaf),
          [sub] "{ecx}" (subleaf),
    );
    return .{ .eax = eax, .ebx = ebx, .ecx = ecx, .edx = edx };
}

fn tmm(comptime t: u3) []const u8 {
    return std.fmt.comptimePrint("%%tmm{d}", .{t});
}

/// The instructions. Tile state is per thread: each task configures before its first tile
/// instruction and releases after its last.
pub const Hardware = struct {
    pub inline fn configure(_: *Hardware, cfg: *const Config) void {
        asm volatile ("ldtilecfg (%[c])"
            :
            : [c] "r" (cfg),
            : "memory");
    }
    pub inline fn release(_: *Hardware) void {
        asm volatile ("tilerelease");
    }
    pub inline fn zero(_: *Hardware, comptime t: u3) void {
        asm volatile ("tilezero " ++ tmm(t));
    }
    pub inline fn load(_: *Hardware, comptime t: u3, p: [*]const u8, stride: usize) void {
        asm volatile ("tileloadd (%[p],%[s],1), " ++ tmm(t)
            :
            : [p] "r" (p),
              [s] "r" (stride),
            : "memory");
    }
    pub inline fn store(_: *Hardware, comptime t: u3, p: [*]u8, stride: usize) void {
        asm volatile ("tilestored " ++ tmm(t) ++ ", (%[p],%[s],1)"
            :
            : [p] "r" (p),
              [s] "r" (stride),
            : "memory");
    }
    /// C[c] += A[a] x B[b], signed bytes by signed bytes.
    pub inline fn dpbssd(_: *Hardware, comptime c: u3, comptime a: u3, comptime b: u3) void {
        asm volatile ("tdpbssd " ++ tmm(b) ++ ", " ++ tmm(a) ++ ", " ++ tmm(c));
    }
};

/// The same operations on eight 1 KiB buffers: what the instructions are specified to compute.
pub const Emulated = struct {
    cfg: Config = .{},
    tiles: [8][rows_max * colsb_max]u8 = @splat(@splat(0)),

    pub fn configure(e: *Emulated, cfg: *const Config) void {
        e.cfg = cfg.*;
        e.tiles = @splat(@splat(0));
    }
    pub fn release(e: *Emulated) void {
        e.cfg = .{};
    }
    pub fn zero(e: *Emulated, comptime t: u3) void {
        e.tiles[t] = @splat(0);
    }
    pub fn load(e: *Emulated, comptime t: u3, p: [*]const u8, stride: usize) void {
        const colsb = e.cfg.colsb[t];
        e.tiles[t] = @splat(0);
        for (0..e.cfg.rows[t]) |r| @memcpy(e.tiles[t][r * colsb_max ..][0..colsb], p[r * stride ..][0..colsb]);
    }
    pub fn store(e: *Emulated, comptime t: u3, p: [*]u8, stride: usize) void {
        const colsb = e.cfg.colsb[t];
        for (0..e.cfg.rows[t]) |r| @memcpy(p[r * stride ..][0..colsb], e.tiles[t][r * colsb_max ..][0..colsb]);
    }
    pub fn dpbssd(e: *Emulated, comptime c: u3, comptime a: u3, comptime b: u3) void {
        const m_rows = e.cfg.rows[a];
        const k_quads = e.cfg.colsb[a] / 4;
        const n_cols = e.cfg.colsb[c] / 4;
        // The operands' shapes must agree, as the instruction faults where they do not.
        std.debug.assert(e.cfg.rows[c] == m_rows and e.cfg.rows[b] == k_quads and e.cfg.colsb[b] == 4 * n_cols);
        for (0..m_rows) |m| {
            for (0..n_cols) |n| {
                const at = m * colsb_max + 4 * n;
                var sum: i32 = std.mem.readInt(i32, e.tiles[c][at..][0..4], .little);
                for (0..k_quads) |k| {
                    for (0..4) |i| {
                        const x: i8 = @bitCast(e.tiles[a][m * colsb_max + 4 * k + i]);
                        const y: i8 = @bitCast(e.tiles[b][k * colsb_max + 4 * n + i]);
                        sum +%= @as(i32, x) * y;
                    }
                }
                std.mem.writeInt(i32, e.tiles[c][at..][0..4], sum, .little);
            }
        }
    }
};

test "emulated tdpbssd: C[m][n] += sum_k A[m][k] * B[k/4][4n + k%4]" {
    var e: Emulated = .{};
    var cfg: Config = .{};
    cfg.set(0, 3, 8); // A: 3 x 8 bytes
    cfg.set(1, 2, 12); // B: 2 quads x 3 columns
    cfg.set(2, 3, 12); // C: 3 x 3 i32
    e.configure(&cfg);
    var rng = std.Random.DefaultPrng.init(5);
    var a: [3][8]i8 = undefined;
    var b: [2][12]i8 = undefined;
    rng.random().bytes(std.mem.asBytes(&a));
    rng.random().bytes(std.mem.asBytes(&b));
    e.load(0, @ptrCast(&a), 8);
    e.load(1, @ptrCast(&b), 12);
    e.zero(2);
    e.dpbssd(2, 0, 1);
    e.dpbssd(2, 0, 1);
    var c: [3][3]i32 = undefined;
    e.store(2, @ptrCast(&c), 12);
    for (0..3) |m| for (0..3) |n| {
        var want: i32 = 0;
        for (0..8) |k| want += @as(i32, a[m][k]) * b[k / 4][4 * n + k % 4];
        try std.testing.expectEqual(2 * want, c[m][n]);
    };
}
