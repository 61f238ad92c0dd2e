//! Status codes and the last-error message: how failures cross the C boundary.
//! Every exported call that can fail returns a Status; on failure the message is kept
//! (per thread) until the next failure and read with infer_last_error().
const std = @import("std");

pub const Status = enum(i32) {
    ok = 0,
    invalid_argument = 1,
    io = 2,
    out_of_memory = 3,
    unsupported = 4,
    internal = 5,
};

threadlocal var message_buf: [1024]u8 = undefined;
threadlocal var message_len: usize = 0;

/// Records a formatted message and returns `status`, so call sites read `return fail(.io, ...)`.
pub fn fail(status: Status, comptime fmt: []const u8, args: anytype) i32 {
    std.debug.assert(status != .ok);
    const written = std.fmt.bufPrint(message_buf[0 .. message_buf.len - 1], fmt, args) catch blk: {
        const ellipsis = "...";
        @memcpy(message_buf[message_buf.len - 1 - ellipsis.len .. message_buf.len - 1], ellipsis);
        break :blk message_buf[0 .. message_buf.len - 1];
    };
    message_len = written.len;
    message_buf[message_len] = 0;
    return @intFromEnum(status);
}

pub fn lastError() [*:0]const u8 {
    if (message_len == 0) return "";
    return @ptrCast(&message_buf);
}

test "fail keeps a terminated message" {
    const code = fail(.io, "cannot open {s}", .{"x.gguf"});
    try std.testing.expectEqual(@as(i32, 2), code);
    try std.testing.expectEqualStrings("cannot open x.gguf", std.mem.span(lastError()));
}
