// The server's counters and gauges, as Prometheus text for GET /metrics.
import type { EngineStats } from "../runtime/messages.ts";

export interface MetricsState {
  readonly queueDepth: number;
  readonly running: number;
  readonly slots: number;
  readonly engine: EngineStats | null;
  readonly busyMs: number;
  readonly stalled: boolean;
  readonly bodyBytesInFlight: number;
}

export class Metrics {
  readonly requests = new Map<string, number>();
  tokensGenerated = 0;
  promptTokens = 0;
  ttftSum = 0;
  ttftCount = 0;
  generationSeconds = 0;
  cancelled = 0;

  count(endpoint: string, status: number): void {
    const key = `endpoint="${endpoint}",status="${status}"`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
  }

  text(state: MetricsState): string {
    const { queueDepth, running, engine: e } = state;
    const lines = [
      "# HELP infer_requests_total HTTP requests answered, by endpoint and status.",
      "# TYPE infer_requests_total counter",
      ...[...this.requests].map(([k, v]) => `infer_requests_total{${k}} ${v}`),
      "# HELP infer_queue_depth Requests waiting for the engine.",
      "# TYPE infer_queue_depth gauge", `infer_queue_depth ${queueDepth}`,
      "# HELP infer_requests_running Requests the engine is generating for.",
      "# TYPE infer_requests_running gauge", `infer_requests_running ${running}`,
      "# HELP infer_tokens_generated_total Completion tokens generated.",
      "# TYPE infer_tokens_generated_total counter", `infer_tokens_generated_total ${this.tokensGenerated}`,
      "# HELP infer_prompt_tokens_total Prompt tokens of finished requests.",
      "# TYPE infer_prompt_tokens_total counter", `infer_prompt_tokens_total ${this.promptTokens}`,
      "# HELP infer_generation_seconds_total Seconds spent generating (tokens/s = tokens / seconds).",
      "# TYPE infer_generation_seconds_total counter",
      `infer_generation_seconds_total ${this.generationSeconds.toFixed(6)}`,
      "# HELP infer_time_to_first_token_seconds From a request's arrival to its first text.",
      "# TYPE infer_time_to_first_token_seconds summary",
      `infer_time_to_first_token_seconds_sum ${this.ttftSum.toFixed(6)}`,
      `infer_time_to_first_token_seconds_count ${this.ttftCount}`,
      "# HELP infer_requests_cancelled_total Requests whose client went away before the end.",
      "# TYPE infer_requests_cancelled_total counter", `infer_requests_cancelled_total ${this.cancelled}`,
      "# HELP infer_slots Sequence slots (KV caches) of the engine.",
      "# TYPE infer_slots gauge", `infer_slots ${state.slots}`,
      "# HELP infer_slots_busy Slots holding a running sequence.",
      "# TYPE infer_slots_busy gauge", `infer_slots_busy ${e?.busySlots ?? 0}`,
      "# HELP infer_prefix_cache_blocks Blocks of keys and values the prefix cache holds.",
      "# TYPE infer_prefix_cache_blocks gauge", `infer_prefix_cache_blocks ${e?.prefixBlocks ?? 0}`,
      "# HELP infer_prefix_cache_bytes Memory the prefix cache has allocated (bounded by its budget).",
      "# TYPE infer_prefix_cache_bytes gauge", `infer_prefix_cache_bytes ${e?.prefixBytes ?? 0}`,
      "# HELP infer_prefix_cache_restored_tokens_total Prompt tokens copied from the prefix cache.",
      "# TYPE infer_prefix_cache_restored_tokens_total counter",
      `infer_prefix_cache_restored_tokens_total ${e?.prefixRestoredTokens ?? 0}`,
      "# HELP infer_prefix_cache_prompt_tokens_total Prompt tokens looked up in the prefix cache.",
      "# TYPE infer_prefix_cache_prompt_tokens_total counter",
      `infer_prefix_cache_prompt_tokens_total ${e?.prefixLookedUpTokens ?? 0}`,
      "# HELP infer_resident_memory_bytes Resident memory of the process (the engine's worker included).",
      "# TYPE infer_resident_memory_bytes gauge", `infer_resident_memory_bytes ${process.memoryUsage.rss()}`,
      "# HELP infer_engine_busy_seconds How long the engine's current step has run (0: idle).",
      "# TYPE infer_engine_busy_seconds gauge",
      `infer_engine_busy_seconds ${(state.busyMs / 1000).toFixed(3)}`,
      "# HELP infer_engine_stalled 1 while a step has run past the step timeout (see /health).",
      "# TYPE infer_engine_stalled gauge", `infer_engine_stalled ${state.stalled ? 1 : 0}`,
      "# HELP infer_request_body_bytes_in_flight Bytes of request bodies being received.",
      "# TYPE infer_request_body_bytes_in_flight gauge",
      `infer_request_body_bytes_in_flight ${state.bodyBytesInFlight}`,
    ];
    return lines.join("\n") + "\n";
  }
}
