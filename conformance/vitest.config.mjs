// Lets vitest find the suite's own runner inside node_modules (its default include/exclude
// would skip it) and this folder's programmatic entry.
import { defineConfig } from "vitest/config"
export default defineConfig({
  test: {
    include: [
      "node_modules/@durable-streams/server-conformance-tests/dist/test-runner.js",
      "*.test.mjs",
    ],
    exclude: [],
    testTimeout: 30000,
  },
})
