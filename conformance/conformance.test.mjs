// The official suite, with the options its CLI hides (long-poll timeout, subscriptions).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"
const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("set CONFORMANCE_TEST_URL")
runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_TIMEOUT_MS ?? 20000),
  subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1",
})
