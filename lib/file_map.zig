//! Read-only memory maps of model files. The library owns the mapping (one owner, explicit
//! close), so TypeScript only ever holds views of it and never copies weights.
const std = @import("std");
const status = @import("status.zig");

pub const Mapping = struct {
    bytes: []align(std.heap.page_size_min) const u8,
};

pub fn open(path: []const u8, out: *Mapping) i32 {
    const file = std.fs.cwd().openFile(path, .{}) catch |err|
        return status.fail(.io, "cannot open '{s}': {s}", .{ path, @errorName(err) });
    defer file.close();
    const size = file.getEndPos() catch |err|
        return status.fail(.io, "cannot size '{s}': {s}", .{ path, @errorName(err) });
    if (size == 0) return status.fail(.invalid_argument, "'{s}' is empty", .{path});
    const bytes = std.posix.mmap(null, size, std.posix.PROT.READ, .{ .TYPE = .PRIVATE }, file.handle, 0) catch |err|
        return status.fail(.io, "cannot map '{s}': {s}", .{ path, @errorName(err) });
    out.* = .{ .bytes = bytes };
    return 0;
}

pub fn close(mapping: Mapping) void {
    std.posix.munmap(mapping.bytes);
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
