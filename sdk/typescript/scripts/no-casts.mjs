// Fails when the SDK or its tests hold a cast: a type assertion (`x as T`, `<T>x`), a
// non-null assertion (`x!`), a definite-assignment assertion (`field!: T`), the `any` type,
// or a comment that silences the compiler (@ts-ignore, @ts-expect-error, @ts-nocheck).
// The generated schema is checked too. It walks the syntax tree with the TypeScript
// compiler's own parser, so strings and comments that merely mention these are not flagged.
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import ts from "typescript";

const root = new URL("..", import.meta.url).pathname;

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return files(p);
    return e.name.endsWith(".ts") ? [p] : [];
  });
}

const found = [];
for (const file of [...files(join(root, "src")), ...files(join(root, "test"))]) {
  const text = readFileSync(file, "utf8");
  const src = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const report = (node, what) => {
    const { line, character } = src.getLineAndCharacterOfPosition(node.getStart(src));
    found.push(`${relative(root, file)}:${line + 1}:${character + 1}: ${what}: ${node.getText(src).slice(0, 80)}`);
  };
  const visit = (node) => {
    if (ts.isAsExpression(node)) report(node, "type assertion (as)");
    else if (ts.isTypeAssertionExpression(node)) report(node, "type assertion (<T>)");
    else if (ts.isNonNullExpression(node)) report(node, "non-null assertion (!)");
    else if (node.kind === ts.SyntaxKind.AnyKeyword) report(node, "the any type");
    else if ((ts.isPropertyDeclaration(node) || ts.isVariableDeclaration(node)) && node.exclamationToken !== undefined) {
      report(node, "definite-assignment assertion (!)");
    }
    ts.forEachChild(node, visit);
  };
  visit(src);
  for (const m of text.matchAll(/@ts-(ignore|expect-error|nocheck)/g)) {
    const { line } = src.getLineAndCharacterOfPosition(m.index);
    found.push(`${relative(root, file)}:${line + 1}: a comment that silences the compiler: ${m[0]}`);
  }
}
if (found.length > 0) {
  console.error(`no-casts: ${found.length} cast(s); narrow with a type guard instead:\n${found.join("\n")}`);
  process.exit(1);
}
console.log("no-casts: no type assertions, non-null assertions or any in src/ and test/");
