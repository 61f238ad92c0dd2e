// How many threads the CPU backend runs by default: one per physical core this process may use.
// Decode streams the weights from memory and prefill keeps the vector units busy; a core's second
// hardware thread adds neither bandwidth nor vector units, only a second thread that every op's
// barrier must wait for (llama.cpp defaults to physical cores for the same reason). Linux reads
// the topology from /sys (the CPUs of this process's affinity mask, grouped by the core they
// share); elsewhere, and where /sys is unreadable, every logical CPU counts.
import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { platform } from "node:process";

/** "0-3,8,10-11" → [0, 1, 2, 3, 8, 10, 11]; an unreadable part is skipped. */
export function parseCpuList(list: string): number[] {
  const cpus: number[] = [];
  for (const part of list.trim().split(",")) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) continue;
    const first = Number(m[1]), last = m[2] === undefined ? first : Number(m[2]);
    for (let c = first; c <= last && c - first < 65536; c++) cpus.push(c);
  }
  return cpus;
}

/**
 * Physical cores among `cpus`: CPUs whose sibling lists are equal share a core. `siblings`
 * returns a CPU's sibling list, or null where it is unknown (that CPU then counts as a core).
 */
export function countCores(cpus: readonly number[], siblings: (cpu: number) => string | null): number {
  const cores = new Set<string>();
  for (const cpu of cpus) cores.add(siblings(cpu)?.trim() || `cpu${cpu}`);
  return cores.size;
}

function readOrNull(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}

/** This process's allowed CPUs (Linux), or null where unknown. */
function allowedCpus(): number[] | null {
  const status = readOrNull("/proc/self/status");
  const m = status ? /^Cpus_allowed_list:\s*(.+)$/m.exec(status) : null;
  const cpus = m ? parseCpuList(m[1]) : [];
  return cpus.length > 0 ? cpus : null;
}

let cached: number | null = null;

/** The default thread count: physical cores this process may run on, at least 1. */
export function defaultThreads(): number {
  if (cached !== null) return cached;
  const logical = availableParallelism();
  let cores = logical;
  const cpus = platform === "linux" ? allowedCpus() : null;
  if (cpus) {
    const topology = (cpu: number) => `/sys/devices/system/cpu/cpu${cpu}/topology/`;
    const counted = countCores(cpus, (cpu) =>
      readOrNull(topology(cpu) + "core_cpus_list") ?? readOrNull(topology(cpu) + "thread_siblings_list"));
    cores = Math.min(counted, logical);
  }
  cached = Math.max(1, cores);
  return cached;
}
