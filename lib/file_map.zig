//! Read-only memory maps of model files. The library owns the mapping (one owner, explicit
//! close), so TypeScript only ever holds views of it and never copies weights.
const std = @import("std");
const status = @import("status.zig");

pub const Mapping = struct {
    bytes: []align(std.heap.page_size_min) const u8,
};

pub fn open(path: []const u8, out: *Mapping) i32 {
    const file = std.fs.cwd().openFile(path, .{}) catch |err|
        return status.fail(.io, "cannot open '{s}': {s}", .{ path, reason(err) });
    defer file.close();
    const stat = file.stat() catch |err|
        return status.fail(.io, "cannot size '{s}': {s}", .{ path, @errorName(err) });
    // A folder opens for reading on Linux and only fails at mmap ("MemoryMappingNotSupported").
    if (stat.kind == .directory)
        return status.fail(.invalid_argument, "'{s}' is a folder, not a file", .{path});
    if (stat.kind != .file)
        return status.fail(.invalid_argument, "'{s}' is not a regular file", .{path});
    if (stat.size == 0) return status.fail(.invalid_argument, "'{s}' is empty", .{path});
    const read = std.posix.PROT.READ;
    const bytes = std.posix.mmap(null, stat.size, read, .{ .TYPE = .PRIVATE }, file.handle, 0) catch |e|
        return status.fail(.io, "cannot map '{s}': {s}", .{ path, @errorName(e) });
    out.* = .{ .bytes = bytes };
    return 0;
}

/// The common reasons an open fails, in words; the error's name otherwise.
fn reason(err: std.fs.File.OpenError) []const u8 {
    return switch (err) {
        error.FileNotFound => "no such file",
        error.AccessDenied => "permission denied",
        error.IsDir => "it is a folder",
        error.NotDir => "a part of the path is not a folder",
        error.NameTooLong => "the name is too long",
        else => @errorName(err),
    };
}

pub fn close(mapping: Mapping) void {
    std.posix.munmap(mapping.bytes);
}

/// Drops the whole pages of bytes [offset, offset + len) of the mapping from this process's
/// memory (madvise DONTNEED) once their bytes live elsewhere — a weight repacked into its own
/// copy — so they stop counting twice. Nothing is lost: the mapping is private and never
/// written, so a later read faults the file's bytes back in from the page cache. (On anonymous
/// memory DONTNEED would zero the pages: hence a mapping and a range inside it, never an address.)
pub fn release(mapping: Mapping, offset: usize, len: usize) i32 {
    if (offset > mapping.bytes.len or len > mapping.bytes.len - offset)
        return status.fail(.invalid_argument, "release: bytes {d}..{d} of a {d}-byte mapping", .{ offset, offset +| len, mapping.bytes.len });
    const page = std.heap.pageSize();
    const address = @intFromPtr(mapping.bytes.ptr) + offset;
    const start = std.mem.alignForward(usize, address, page);
    const end = std.mem.alignBackward(usize, address + len, page);
    if (end <= start) return 0;
    const ptr: [*]align(std.heap.page_size_min) u8 = @ptrFromInt(start);
    std.posix.madvise(ptr, end - start, std.posix.MADV.DONTNEED) catch {}; // a hint: no harm if refused
    return 0;
}

test "map and unmap a file" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "m.bin", .data = "GGUF1234" });
    const path = try tmp.dir.realpathAlloc(std.testing.allocator, "m.bin");
    defer std.testing.allocator.free(path);
    var m: Mapping = undefined;
    try std.testing.expectEqual(@as(i32, 0), open(path, &m));
    defer close(m);
    try std.testing.expectEqualStrings("GGUF1234", m.bytes);
    try std.testing.expect(open("/nonexistent/x.gguf", &m) != 0);
}

test "a folder is refused before mapping" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const path = try tmp.dir.realpathAlloc(std.testing.allocator, ".");
    defer std.testing.allocator.free(path);
    var m: Mapping = undefined;
    try std.testing.expect(open(path, &m) != 0);
}

test "released pages of a mapping read back the file's bytes" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    var data: [5 * 4096 + 123]u8 = undefined;
    for (&data, 0..) |*b, i| b.* = @truncate(i * 7 + 3);
    try tmp.dir.writeFile(.{ .sub_path = "w.bin", .data = &data });
    const path = try tmp.dir.realpathAlloc(std.testing.allocator, "w.bin");
    defer std.testing.allocator.free(path);
    var m: Mapping = undefined;
    try std.testing.expectEqual(@as(i32, 0), open(path, &m));
    defer close(m);
    try std.testing.expectEqualSlices(u8, &data, m.bytes); // every page touched
    try std.testing.expectEqual(@as(i32, 0), release(m, 100, m.bytes.len - 200));
    try std.testing.expectEqualSlices(u8, &data, m.bytes);
    try std.testing.expect(release(m, 100, m.bytes.len) != 0);
}
