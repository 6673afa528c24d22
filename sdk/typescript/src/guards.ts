// Type guards for values that arrive as unknown (parsed JSON). They let the SDK narrow
// without casts: whatever the server sends, a value is used only after it was checked.

/** A plain JSON object. */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The string at key, or undefined when it is absent or not a string. */
export function stringField(o: Record<string, unknown>, key: string): string | undefined {
  const v = o[key];
  return typeof v === "string" ? v : undefined;
}

/** The finite number at key, or undefined when it is absent or not a number. */
export function numberField(o: Record<string, unknown>, key: string): number | undefined {
  const v = o[key];
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

/** The member of values equal to v, or undefined: narrows a string to a union of literals. */
export function oneOf<T extends string>(values: ReadonlyArray<T>, v: unknown): T | undefined {
  return values.find((x) => x === v);
}

/** JSON.parse into unknown, or undefined when the text is not JSON. */
export function parseJSON(text: string): unknown {
  try {
    const v: unknown = JSON.parse(text);
    return v;
  } catch {
    return undefined;
  }
}
