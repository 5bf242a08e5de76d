// A real submit through a client generated from api/openapi.yaml (openapi-typescript types,
// openapi-fetch calls). `npm run check` only type-checks it: the description must let a client
// send what the README sends and read what the API answers.
import createClient from "openapi-fetch";

import type { components, paths } from "../generated/llmq.js";

type Job = components["schemas"]["Job"];

const client = createClient<paths>({ baseUrl: "http://127.0.0.1:8080" });

export async function submit(): Promise<Job> {
  const { data, error, response } = await client.POST("/v1/jobs", {
    params: { header: { "Idempotency-Key": "tour-1" } },
    body: {
      credential: "default",
      request: {
        model: "claude-sonnet-4-5",
        max_tokens: 256,
        messages: [{ role: "user", content: "Say hello" }],
      },
      timeout: "10m",
      max_attempts: 8,
      fallbacks: ["backup"],
      metadata: { order: "42", tags: ["tour"] },
    },
  });
  if (error) {
    throw new Error(`${response.status} ${error.error.type}: ${error.error.message}`);
  }
  const ended: boolean = ["succeeded", "failed", "dead", "canceled"].includes(data.status);
  const cls: string | undefined = data.last_error?.class;
  void ended, cls;
  return data;
}

// Only `request` is required (the README's tour sends nothing else): every other field of the
// body stays optional in the generated types, those with a default on the server too.
export async function submitMinimal(): Promise<Job | undefined> {
  const { data } = await client.POST("/v1/jobs", {
    body: { request: { model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: "Say hello" }] } },
  });
  return data;
}

// A field sent as null is the same as left out (the server takes its default): the types let a
// client whose unset fields are null send them.
export async function submitNulls(): Promise<Job | undefined> {
  const { data } = await client.POST("/v1/jobs", {
    body: {
      request: { model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: "Say hello" }] },
      credential: null,
      timeout: null,
      attempt_timeout: null,
      first_byte_timeout: null,
      max_attempts: null,
      metadata: null,
      fallbacks: null,
      lane: null,
      priority: null,
    },
  });
  return data;
}

export async function poll(id: string): Promise<Job | undefined> {
  const { data } = await client.GET("/v1/jobs/{id}", { params: { path: { id } } });
  return data;
}

// Every job answer carries every field of Job but events_url (null when unset): a client reads
// them without a check for undefined.
export function fields(job: Job): [string, string, string, string[], string | null, "online" | "batch", string] {
  return [job.deadline, job.timeout, job.priority, job.fallbacks, job.finished_at, job.lane, job.created_at];
}

export function lastErrorOf(job: Job): string | null {
  return job.last_error === null ? null : job.last_error.class;
}

// The types still refuse what the API refuses.
export async function refused(): Promise<void> {
  // @ts-expect-error request is required
  await client.POST("/v1/jobs", { body: { credential: "default" } });
  // @ts-expect-error unknown fields are refused (additionalProperties: false)
  await client.POST("/v1/jobs", { body: { request: {}, priority: "urgent" } });
  const { data } = await client.GET("/v1/jobs/{id}", { params: { path: { id: "x" } } });
  // @ts-expect-error server_error is no class llmq sends
  const never: NonNullable<Job["last_error"]>["class"] = "server_error";
  void data, never;
}
