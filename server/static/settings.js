// The settings form of a conversation, made from the server's settings (GET /v1/settings): a field
// per setting a request may set, named as its request field, with this server's bounds, choices
// and default; left empty, the request leaves the field out (the server's own). Loaded before
// app.js, whose state, element(), api() and save() these functions use once the page starts.
"use strict";

async function loadSettings() {
  const response = await api("/v1/settings");
  if (!response.ok) return say(await failure(response), true);
  state.settings = (await response.json()).data;
  const form = $("settings-form");
  form.replaceChildren();
  for (const setting of state.settings) {
    const input = setting.kind === "number" || setting.kind === "integer" ? numberInput(setting) : choiceSelect(setting);
    input.id = `set-${setting.name.replaceAll("_", "-")}`;
    input.name = setting.field;
    input.title = setting.description;
    input.addEventListener("change", () => { state.current.settings[setting.field] = input.value; save(); });
    const label = element("label", setting.label[0].toUpperCase() + setting.label.slice(1));
    label.htmlFor = input.id;
    label.title = setting.description;
    form.append(label, input);
  }
}

function numberInput(setting) {
  const input = element("input");
  input.type = "number";
  if (setting.minimum !== null) input.min = setting.minimum;
  if (setting.maximum !== null) input.max = setting.maximum;
  input.step = setting.kind === "integer" ? "1" : "any";
  input.placeholder = setting.default === null ? "server's" : String(setting.default);
  return input;
}

function choiceSelect(setting) {
  const select = element("select");
  const values = setting.kind === "boolean" ? ["true", "false"] : setting.choices;
  const unset = setting.default === null ? "server's" : `server's: ${setting.default}`;
  for (const [value, text] of [["", unset], ...values.map((value) => [value, value])]) {
    const option = element("option", text);
    option.value = value;
    select.append(option);
  }
  return select;
}

function settingInput(setting) {
  return $("settings-form").querySelector(`[name="${setting.field}"]`);
}

// The value of a setting the conversation sets, as its request field takes it.
function requestValue(setting, value) {
  if (setting.kind === "boolean") return value === "true";
  return setting.kind === "choice" ? value : Number(value);
}
