//! The settings in force (lib/abi.zig Settings): their defaults until the host passes its own
//! through infer_configure, once, after loading the library.
const abi = @import("abi.zig");

pub var current: abi.Settings = .{};
