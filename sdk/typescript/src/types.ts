// Short names for the schemas of openapi/openapi.yaml. The types themselves are generated
// into schema.gen.ts by openapi-typescript; this file only names them.

import type { KnownEventType } from "./codes.gen.js";
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
export type SandboxMetrics = Schemas["SandboxMetrics"];
export type UsageSample = Schemas["UsageSample"];
export type SleepPolicy = Schemas["SleepPolicy"];
export type Volume = Schemas["Volume"];
export type VolumeList = Schemas["VolumeList"];
export type VolumeMount = Schemas["VolumeMount"];
export type VolumeFileEntry = Schemas["VolumeFileEntry"];
export type Node = Schemas["Node"];
export type NodeList = Schemas["NodeList"];
export type NodePatch = Schemas["NodePatch"];
export type NodeCapacity = Schemas["NodeCapacity"];
export type Secret = Schemas["Secret"];
export type SecretList = Schemas["SecretList"];
export type SecretUse = Schemas["SecretUse"];
export type SecretBindings = Schemas["SecretBindings"];
export type SecretBinding = Schemas["SecretBinding"];
export type SecretHeader = Schemas["SecretHeader"];
export type Checkpoint = Schemas["Checkpoint"];
export type CheckpointList = Schemas["CheckpointList"];
export type PortLink = Schemas["PortLink"];
export type PortLinkInfo = Schemas["PortLinkInfo"];
export type ForkRequest = Schemas["ForkRequest"];
export type ForkResult = Schemas["ForkResult"];
export type ForkItem = Schemas["ForkItem"];
/**
 * An event as parseEvent returns it: of a type the contract documents (it skips the others, as
 * the contract tells clients to; the list is open).
 */
export type Event = Omit<Schemas["Event"], "type"> & { type: KnownEventType };
/** An event type the contract documents. The server may send others, which parseEvent skips. */
export type EventType = KnownEventType;
/**
 * An error code the contract documents. The server may send others (the list is open); the
 * SDK then reports the generic code of the status and keeps the server's in rawCode.
 */
export type { KnownErrorCode as ErrorCode } from "./codes.gen.js";
export type Problem = Schemas["Problem"];
