// The Metal kernel files, imported as text (with { type: "text" }) by metal-shaders.ts.
declare module "*.metal" {
  const text: string;
  export default text;
}
declare module "*.h" {
  const text: string;
  export default text;
}
