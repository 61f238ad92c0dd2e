// A progress bar on stderr for the import and quantize commands: redrawn in place on a terminal,
// a line per tenth of the work otherwise (logs, CI) once a second has passed.
export type Progress = (done: number, total: number, label: string) => void;

export function stderrProgress(what: string): Progress {
  const tty = process.stderr.isTTY === true;
  const t0 = performance.now();
  let lastTenth = -1;
  return (done, total, label) => {
    const fraction = total === 0 ? 1 : done / total;
    const seconds = ((performance.now() - t0) / 1000).toFixed(1);
    if (tty) {
      const width = 30, filled = Math.round(fraction * width);
      const bar = "#".repeat(filled) + ".".repeat(width - filled);
      const line = `${what} [${bar}] ${done}/${total} ${seconds}s ${label}`.slice(0, 118);
      process.stderr.write(`\r\x1b[2K${line}${done === total ? "\n" : ""}`);
      return;
    }
    // Off a terminal, a line per tenth of the work, and only once it is slow enough to matter.
    const tenth = Math.floor(fraction * 10);
    if (tenth === lastTenth || performance.now() - t0 < 1000) return;
    lastTenth = tenth;
    process.stderr.write(
      `${what} ${Math.round(fraction * 100)}% (${done}/${total} tensors, ${seconds}s)\n`);
  };
}
