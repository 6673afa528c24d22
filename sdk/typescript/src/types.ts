// Short names for the schemas of openapi/openapi.yaml. The types themselves are generated
// into schema.gen.ts by openapi-typescript; this file only names them.

import type { components } from "./schema.gen.js";

type Schemas = components["schemas"];

export type Sandbox = Schemas["Sandbox"];
export type SandboxState = Schemas["SandboxState"];
export type SandboxList = Schemas["SandboxList"];
export type CreateSandboxRequest = Schemas["CreateSandboxRequest"];
export type Resources = Schemas["Resources"];
export type LastExit = Schemas["LastExit"];
export type ExecRequest = Schemas["ExecRequest"];
export type ExecResult = Schemas["ExecResult"];
export type FileEntry = Schemas["FileEntry"];
export type Template = Schemas["Template"];
export type TemplateList = Schemas["TemplateList"];
export type Generation = Schemas["Generation"];
export type GenerationList = Schemas["GenerationList"];
export type Lease = Schemas["Lease"];
export type Info = Schemas["Info"];
export type Event = Schemas["Event"];
export type EventType = Schemas["Event"]["type"];
/**
 * An error code the contract documents. The server may send others (the list is open); the
 * SDK then reports the generic code of the status and keeps the server's in rawCode.
 */
export type { KnownErrorCode as ErrorCode } from "./codes.gen.js";
export type Problem = Schemas["Problem"];
