import { expect, test } from "bun:test";
import { availableParallelism } from "node:os";
import { countCores, defaultThreads, parseCpuList } from "../ts/native/cpu-cores.ts";
import { threadsOption } from "../ts/cli/options.ts";

test("parseCpuList reads the kernel's CPU lists", () => {
  expect(parseCpuList("0-3,8,10-11\n")).toEqual([0, 1, 2, 3, 8, 10, 11]);
  expect(parseCpuList("5")).toEqual([5]);
  expect(parseCpuList("")).toEqual([]);
  expect(parseCpuList("x,2")).toEqual([2]);
});

test("countCores counts hyperthread pairs once", () => {
  // 8 cores with two threads each, numbered as Linux does on Intel (cpu i and i+8 share a core).
  const siblings = (cpu: number) => `${cpu % 8},${(cpu % 8) + 8}\n`;
  expect(countCores(parseCpuList("0-15"), siblings)).toBe(8);
  // An affinity mask of one thread per core, or of both threads of two cores.
  expect(countCores(parseCpuList("0-7"), siblings)).toBe(8);
  expect(countCores([0, 8, 1, 9], siblings)).toBe(2);
  // No topology: every CPU counts.
  expect(countCores([0, 1, 2], () => null)).toBe(3);
});

test("the default thread count is the physical cores, at most the logical CPUs", () => {
  const n = defaultThreads();
  expect(n).toBeGreaterThanOrEqual(1);
  expect(n).toBeLessThanOrEqual(availableParallelism());
  expect(threadsOption(undefined)).toBe(n);
  expect(threadsOption("1")).toBe(1);
});
