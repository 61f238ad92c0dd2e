//! The Objective-C runtime, loaded at run time. Metal's API is Objective-C; Apple's C++ wrapper
//! (metal-cpp) is a download from Apple, not a package any registry here serves, and linking
//! Metal.framework at build time would need the macOS SDK on the build machine and would tie the
//! library to it. Instead: dlopen libobjc, Foundation and Metal when the backend starts, and send
//! messages with objc_msgSend cast to each method's exact C prototype (on arm64 objc_msgSend must
//! be called through the right prototype, never as a variadic function). A Mac build therefore
//! needs no extra step, and a machine without Metal reports "Metal not available" cleanly.
const std = @import("std");

pub const Id = ?*anyopaque;
pub const Sel = ?*anyopaque;
const cc = std.builtin.CallingConvention.c;

pub const Runtime = struct {
    objc_msgSend: *const fn () callconv(cc) void,
    sel_registerName: *const fn ([*:0]const u8) callconv(cc) Sel,
    objc_getClass: *const fn ([*:0]const u8) callconv(cc) Id,
    objc_autoreleasePoolPush: *const fn () callconv(cc) ?*anyopaque,
    objc_autoreleasePoolPop: *const fn (?*anyopaque) callconv(cc) void,
    MTLCreateSystemDefaultDevice: *const fn () callconv(cc) Id,
    /// An NSArray (+1) of every device; null where Metal.framework lacks it.
    MTLCopyAllDevices: ?*const fn () callconv(cc) Id,

    pub fn sel(rt: *const Runtime, name: [*:0]const u8) Sel {
        return rt.sel_registerName(name);
    }

    /// [target selector args...] with the prototype R (Id, Sel, @TypeOf(args)...).
    pub fn send(rt: *const Runtime, comptime R: type, target: Id, selector: Sel, args: anytype) R {
        const A = @TypeOf(args);
        const f = rt.objc_msgSend;
        return switch (@typeInfo(A).@"struct".fields.len) {
            0 => @as(*const fn (Id, Sel) callconv(cc) R, @ptrCast(f))(target, selector),
            1 => @as(*const fn (Id, Sel, @TypeOf(args[0])) callconv(cc) R, @ptrCast(f))(target, selector, args[0]),
            2 => @as(
                *const fn (Id, Sel, @TypeOf(args[0]), @TypeOf(args[1])) callconv(cc) R,
                @ptrCast(f),
            )(target, selector, args[0], args[1]),
            3 => @as(
                *const fn (Id, Sel, @TypeOf(args[0]), @TypeOf(args[1]), @TypeOf(args[2])) callconv(cc) R,
                @ptrCast(f),
            )(target, selector, args[0], args[1], args[2]),
            4 => @as(*const fn (
                Id,
                Sel,
                @TypeOf(args[0]),
                @TypeOf(args[1]),
                @TypeOf(args[2]),
                @TypeOf(args[3]),
            ) callconv(cc) R, @ptrCast(f))(target, selector, args[0], args[1], args[2], args[3]),
            else => @compileError("objc send: at most 4 arguments"),
        };
    }

    /// An autoreleased NSString of `text`.
    pub fn string(rt: *const Runtime, text: [*:0]const u8) Id {
        return rt.send(Id, rt.objc_getClass("NSString"), rt.sel("stringWithUTF8String:"), .{text});
    }

    /// The UTF-8 text of an NSError's localizedDescription, or a fallback.
    pub fn errorText(rt: *const Runtime, err: Id) []const u8 {
        if (err == null) return "unknown error";
        const description = rt.send(Id, err, rt.sel("localizedDescription"), .{});
        const utf8 = rt.send(?[*:0]const u8, description, rt.sel("UTF8String"), .{});
        return if (utf8) |s| std.mem.span(s) else "unknown error";
    }

    /// Takes ownership of an autoreleased object, so that it outlives the pool it came from.
    pub fn retain(rt: *const Runtime, object: Id) Id {
        return if (object != null) rt.send(Id, object, rt.sel("retain"), .{}) else null;
    }

    pub fn release(rt: *const Runtime, object: Id) void {
        if (object != null) rt.send(void, object, rt.sel("release"), .{});
    }
};

pub const LoadError = struct { reason: []const u8 };

const libobjc = "/usr/lib/libobjc.A.dylib";
const foundation = "/System/Library/Frameworks/Foundation.framework/Foundation";
const metal_framework = "/System/Library/Frameworks/Metal.framework/Metal";
const core_graphics = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics";

fn symbol(handle: *anyopaque, comptime name: [:0]const u8) ?*anyopaque {
    return std.c.dlsym(handle, name);
}

/// Opens the runtime and the frameworks and resolves every entry point, or says why not.
pub fn load(out: *Runtime) ?LoadError {
    const objc = std.c.dlopen(libobjc, .{ .NOW = true }) orelse return .{ .reason = "cannot load " ++ libobjc };
    // Foundation registers NSString; Metal exports MTLCreateSystemDefaultDevice.
    _ = std.c.dlopen(foundation, .{ .NOW = true }) orelse return .{ .reason = "cannot load Foundation" };
    const mtl = std.c.dlopen(metal_framework, .{ .NOW = true }) orelse
        return .{ .reason = "cannot load Metal.framework" };
    inline for (.{ "objc_msgSend", "sel_registerName", "objc_getClass", "objc_autoreleasePoolPush", "objc_autoreleasePoolPop" }) |name| {
        const sym = symbol(objc, name) orelse return .{ .reason = "libobjc lacks " ++ name };
        @field(out, name) = @ptrCast(@alignCast(sym));
    }
    const create = symbol(mtl, "MTLCreateSystemDefaultDevice") orelse
        return .{ .reason = "Metal.framework lacks MTLCreateSystemDefaultDevice" };
    out.MTLCreateSystemDefaultDevice = @ptrCast(@alignCast(create));
    out.MTLCopyAllDevices = if (symbol(mtl, "MTLCopyAllDevices")) |all| @ptrCast(@alignCast(all)) else null;
    // MTLCreateSystemDefaultDevice returns nil in command-line processes that have not loaded
    // CoreGraphics (reported on Apple silicon, macOS 14); apps get it through AppKit, llama.cpp
    // and MLX through MetalKit / QuartzCore, a Bun process through nothing. Loading it is enough;
    // where it is missing the caller still falls back to MTLCopyAllDevices.
    _ = std.c.dlopen(core_graphics, .{ .NOW = true });
    return null;
}
